//! The embedded pod runner: plays kubelet for launcher pods on this node (embedded mode only).
//!
//! Data flow: watches pods bound to this node (`spec.nodeName`). A pod whose first container
//! uses the launcher image runs as a host process ([`process`]): the container's
//! `command[1..] + args` are passed to the configured launcher program (the `kubevirt-rs`
//! binary), in the pod's state directory `<state dir>/<pod uid>/`, which is also where the
//! launcher puts its command socket. The runner reports the pod status kubelet would
//! ([`status`]), stops the process group on delete (SIGTERM, then SIGKILL after the grace
//! period) and then removes the pod with a zero grace period, and re-adopts running
//! processes after a restart. Directories of pods it does not know are handled by
//! [`orphans`]: quarantined, never deleted, and their launchers stopped only once the API
//! confirms the pod is gone. A pod whose image it cannot run fails at once with reason
//! `UnsupportedImage` instead of hanging.
//!
//! # Guarantees
//! - At most one process per pod container: the on-disk record is written before the status
//!   is reported, and a pod with a record is never started again.
//! - A pod status is written only when phase or container states change.
//!
//! # Caveats
//! Only the first container is run; the others (such as `guest-console-log`) are views of the
//! same process and share its state.

pub mod logs;
pub mod orphans;
pub mod process;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, warn};

use process::{ContainerPaths, ExitRecord, ProcessRecord};
use status::ContainerState;

/// How the runner is set up.
#[derive(Clone, Debug)]
pub struct PodRunnerConfig {
    /// The node whose pods this runner runs.
    pub node_name: String,
    /// Per-pod state directories live here (`<state_dir>/<pod uid>/`).
    pub state_dir: PathBuf,
    /// Images whose name starts with this are run with `launcher_program`.
    pub launcher_image: String,
    /// The program that runs launcher containers (the `kubevirt-rs` binary).
    pub launcher_program: PathBuf,
    /// The address reported as host and pod IP.
    pub host_ip: String,
    /// Append `--fake-qemu` to `launcher` containers (control-plane benchmarks).
    pub fake_qemu: bool,
}

/// Errors of one reconcile of one pod.
#[derive(Debug, thiserror::Error)]
pub enum PodRunnerError {
    /// Starting the container process failed.
    #[error("starting the container of pod {pod}")]
    Start {
        pod: String,
        #[source]
        source: process::ProcessError,
    },
    /// Writing the pod status failed.
    #[error("reporting the status of pod {pod}")]
    ReportStatus {
        pod: String,
        #[source]
        source: kube::Error,
    },
    /// Removing the pod after its containers stopped failed.
    #[error("removing pod {pod}")]
    Remove {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// The pod runner's state across passes.
pub struct PodRunner {
    config: PodRunnerConfig,
    client: kube::Client,
    /// When SIGTERM was sent to a deleting pod's processes: pod uid → SIGKILL deadline.
    kill_deadlines: BTreeMap<String, Instant>,
    /// The status last sent per pod uid, with the pod's resourceVersion the cache showed when
    /// it was sent: while the cache still shows that version, the write has not come back
    /// yet and is not repeated.
    reported: BTreeMap<String, (Option<String>, serde_json::Value)>,
    exits: mpsc::UnboundedSender<()>,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl PodRunner {
    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.config.state_dir.join(uid)
    }

    fn runs_image(&self, image: &str) -> bool {
        !self.config.launcher_image.is_empty() && image.starts_with(&self.config.launcher_image)
    }

    /// Reconciles one pod bound to this node.
    async fn reconcile(&mut self, pod: &Pod) -> Result<(), PodRunnerError> {
        let Some(uid) = pod.metadata.uid.clone() else {
            return Ok(());
        };
        let Some(spec) = &pod.spec else { return Ok(()) };
        let Some(main) = spec.containers.first() else {
            return Ok(());
        };
        let paths = ContainerPaths::new(&self.pod_dir(&uid), &main.name);
        let record: Option<ProcessRecord> = process::read_json(&paths.record);
        let alive = record.as_ref().is_some_and(process::is_alive);

        if pod.metadata.deletion_timestamp.is_some() {
            return self
                .stop_and_remove(pod, &uid, record.as_ref(), alive)
                .await;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let state = if let Some(exit) = process::read_json::<ExitRecord>(&paths.exit) {
            terminated(record.as_ref(), exit)
        } else if let (Some(record), true) = (&record, alive) {
            cap_log(&paths.log).await;
            ContainerState::Running {
                started_at: record.started_at.clone(),
                pid: record.pid,
            }
        } else if let Some(record) = &record {
            // Our record, no exit file, process gone: we were not its parent (restart).
            let exit = ExitRecord {
                exit_code: 137,
                reason: "ContainerStatusUnknown".into(),
                finished_at: crate::now_rfc3339(),
            };
            process::record_exit(&paths, &exit);
            terminated(Some(record), exit)
        } else if matches!(phase, Some("Succeeded" | "Failed")) {
            return Ok(());
        } else {
            let image = main.image.clone().unwrap_or_default();
            if !self.runs_image(&image) {
                ContainerState::Unrunnable {
                    message: format!(
                        "image {image:?} cannot be run by the kubevirt-rs pod runner (it runs {:?} images only)",
                        self.config.launcher_image
                    ),
                }
            } else {
                self.start(pod, &uid, &paths).await?
            }
        };
        self.report(pod, &state).await
    }

    async fn start(
        &mut self,
        pod: &Pod,
        uid: &str,
        paths: &ContainerPaths,
    ) -> Result<ContainerState, PodRunnerError> {
        let spec = pod.spec.as_ref();
        let main = spec.and_then(|s| s.containers.first());
        let mut args: Vec<String> = main
            .and_then(|c| c.command.clone())
            .unwrap_or_default()
            .into_iter()
            .skip(1)
            .collect();
        args.extend(main.and_then(|c| c.args.clone()).unwrap_or_default());
        if self.config.fake_qemu && args.first().is_some_and(|a| a == "launcher") {
            args.push("--fake-qemu".into());
        }
        let mut env: Vec<(String, String)> = main
            .and_then(|c| c.env.clone())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| Some((e.name, e.value?)))
            .collect();
        let pod_dir = self.pod_dir(uid);
        env.push(("KUBEVIRT_RS_POD_DIR".into(), pod_dir.display().to_string()));
        env.push((
            "POD_NAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ));
        env.push((
            "POD_NAMESPACE".into(),
            pod.metadata.namespace.clone().unwrap_or_default(),
        ));
        env.push(("POD_UID".into(), uid.to_owned()));
        let pod_ref = orphans::PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
        };
        orphans::write_pod_ref(&pod_dir, &pod_ref).map_err(|source| PodRunnerError::Start {
            pod: pod_key(pod),
            source: process::ProcessError::Prepare {
                path: pod_dir.join(orphans::POD_REF_FILE),
                source,
            },
        })?;
        let (mut child, record) = process::spawn(&self.config.launcher_program, &args, &env, paths)
            .await
            .map_err(|source| PodRunnerError::Start {
                pod: pod_key(pod),
                source,
            })?;
        info!(pod = %pod_key(pod), pid = record.pid, "started launcher container");
        let exits = self.exits.clone();
        let waiter_paths = paths.clone();
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                process::record_exit(&waiter_paths, &process::exit_from_status(status));
            }
            let _ = exits.send(());
        });
        Ok(ContainerState::Running {
            started_at: record.started_at,
            pid: record.pid,
        })
    }

    async fn report(&mut self, pod: &Pod, state: &ContainerState) -> Result<(), PodRunnerError> {
        let containers: Vec<(String, String)> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
            .collect();
        let now = crate::now_rfc3339();
        let wanted = status::pod_status(
            &containers,
            readiness_gates_true(pod),
            state,
            &self.config.host_ip,
            &now,
        );
        let current = pod
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok());
        if status::same_report(current.as_ref(), &wanted) {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some((version, sent)) = self.reported.get(&uid)
            && *version == pod.metadata.resource_version
            && status::same_report(Some(sent), &wanted)
        {
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = pod.metadata.name.clone().unwrap_or_default();
        api.patch_status(
            &name,
            &PatchParams::default(),
            // Strategic: conditions merge by type, so conditions others own (the readiness
            // gate `kubevirt.io/virtual-machine-unpaused`) are kept.
            &Patch::Strategic(json!({"status": wanted})),
        )
        .await
        .map_err(|source| PodRunnerError::ReportStatus {
            pod: pod_key(pod),
            source,
        })?;
        self.reported
            .insert(uid, (pod.metadata.resource_version.clone(), wanted));
        Ok(())
    }

    async fn stop_and_remove(
        &mut self,
        pod: &Pod,
        uid: &str,
        record: Option<&ProcessRecord>,
        alive: bool,
    ) -> Result<(), PodRunnerError> {
        if let (Some(record), true) = (record, alive) {
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .unwrap_or(30)
                .max(0);
            match self.kill_deadlines.get(uid) {
                None => {
                    info!(pod = %pod_key(pod), grace, "stopping launcher container");
                    process::signal_group(record, Signal::SIGTERM);
                    let deadline =
                        Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                    self.kill_deadlines.insert(uid.to_owned(), deadline);
                }
                Some(deadline) if Instant::now() >= *deadline => {
                    process::signal_group(record, Signal::SIGKILL)
                }
                Some(_) => {}
            }
            return Ok(());
        }
        self.kill_deadlines.remove(uid);
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => {
                return Err(PodRunnerError::Remove {
                    pod: pod_key(pod),
                    source,
                });
            }
        }
        let _ = std::fs::remove_dir_all(self.pod_dir(uid));
        Ok(())
    }
}

/// Rotates a running container's log past [`MAX_LOG_BYTES`] (keeping `<log>.1`), as kubelet
/// caps container logs; the size check is one `stat`, the copy runs off the runtime threads.
async fn cap_log(log: &std::path::Path) {
    use virt_launcher::log_rotation::{MAX_LOG_BYTES, rotate_if_larger};
    if std::fs::metadata(log).is_ok_and(|m| m.len() <= MAX_LOG_BYTES) {
        return;
    }
    let path = log.to_owned();
    match tokio::task::spawn_blocking(move || rotate_if_larger(&path, MAX_LOG_BYTES)).await {
        Ok(Ok(true)) => info!(log = %log.display(), "rotated a container log past its size limit"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => warn!(log = %log.display(), error = %e, "cannot rotate a container log"),
        Err(e) => warn!(error = %e, "log rotation task failed"),
    }
}

/// Whether every readiness gate of the pod has its condition `True` (as kubelet requires
/// for `Ready`).
fn readiness_gates_true(pod: &Pod) -> bool {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default()
        .iter()
        .all(|gate| {
            conditions
                .iter()
                .any(|c| c.type_ == gate.condition_type && c.status == "True")
        })
}

fn terminated(record: Option<&ProcessRecord>, exit: ExitRecord) -> ContainerState {
    ContainerState::Terminated {
        exit_code: exit.exit_code,
        reason: exit.reason,
        started_at: record
            .map(|r| r.started_at.clone())
            .unwrap_or_else(|| exit.finished_at.clone()),
        finished_at: exit.finished_at,
    }
}

/// Runs the pod runner until the future is dropped.
pub async fn run(client: kube::Client, config: PodRunnerConfig) {
    let (exits_tx, mut exits_rx) = mpsc::unbounded_channel();
    let mut runner = PodRunner {
        config,
        client: client.clone(),
        kill_deadlines: BTreeMap::new(),
        reported: BTreeMap::new(),
        exits: exits_tx,
    };
    let mut orphans = orphans::Orphans::new(runner.config.state_dir.clone());
    let api: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", runner.config.node_name);
    let (store, writer) = reflector::store::<Pod>();
    let mut events = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .reflect(writer)
        .boxed();
    // Re-adopted processes are not our children: poll them (and grace deadlines) periodically.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            event = events.next() => if event.is_none() { return },
            _ = exits_rx.recv() => {},
            _ = tick.tick() => {},
        }
        while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
        // Not ready until the initial list is in; blocking here would stop the watcher.
        match futures::FutureExt::now_or_never(store.wait_until_ready()) {
            None => continue,
            Some(Err(_)) => return,
            Some(Ok(())) => {}
        }
        let pods: Vec<Arc<Pod>> = store.state();
        let known: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        for pod in &pods {
            if let Err(e) = runner.reconcile(pod).await {
                warn!(error = %e, "pod runner pass failed; retrying");
            }
        }
        runner.reported.retain(|uid, _| known.contains(uid));
        // Only here, after the initial list: before it every pod would look missing.
        orphans
            .collect(&client, orphans::Cache::Synced(&known))
            .await;
    }
}
