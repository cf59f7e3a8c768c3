//! The pods of this node, as kubelet runs them.
//!
//! Data flow: watches pods bound to this node (`spec.nodeName`). Each container runs as a
//! host process ([`process`]): the image store ([`crate::images`]) resolves the container's
//! image and `command[0]` to a program, and the container's `command[1..] + args` follow,
//! as a container runtime runs them. Before the containers start the pod's volumes are
//! prepared ([`volumes`]) and every container gets a private mount namespace with its
//! `volumeMounts` bind-mounted at their `mountPath`s. On a node with a pod network the pod's
//! network namespace is made next ([`network`]: netns + CNI ADD, the result recorded in the
//! pod directory) and every container of the pod joins it; `hostNetwork` pods, and every pod
//! of a node without a pod network, stay in the host's network with the node's address as
//! `podIP`. The network is released (CNI DEL, namespace deleted) when the pod reaches a
//! terminal phase or, at the latest, after its containers stopped and before the pod object
//! is removed. The runner reports the pod status
//! kubelet would ([`status`]), restarts containers as `restartPolicy` says (with kubelet's
//! back-off), and stops a deleted pod as kubelet does: `SIGTERM` to each container's main
//! process, then `SIGKILL` of whatever is left of its process group after the grace period;
//! then it removes the pod with a zero grace period. Running processes are re-adopted after
//! a restart. Before a container starts, its `command` and `args` are expanded against its
//! environment ([`expansion`]); while it runs, its probes ([`probes`]) decide whether it is
//! started and ready, and a failed liveness or startup probe stops it (`SIGTERM`, `SIGKILL`
//! after the grace period) so that it restarts as any exited container. Directories of pods
//! it does not know are handled by [`orphans`]: quarantined, never deleted, and their
//! processes stopped only once the API confirms the pod is gone.
//!
//! # Guarantees
//! - At most one process per pod container: the on-disk record is written before the status
//!   is reported, and a container with a live record is never started again.
//! - A container whose image the store does not know never starts a process: it waits with
//!   `ErrImagePull`, then `ImagePullBackOff`.
//! - A pod status is written only when phase, pod IP, container states or readiness change.
//! - A stopped pod is deleted once: until the cache drops it (or 10 s pass) it is not
//!   released or deleted again, however many passes run meanwhile.
//! - A watch event reconciles the pod it names; exits, probe results and a 1 s tick
//!   reconcile every pod.
//! - A container that ends while this runner is its parent is reported with its real exit
//!   code: between its end and the waiter's exit record it still shows as running, never as
//!   `ContainerStatusUnknown` (which is for processes re-adopted after a restart).
//! - No container of a pod with its own network starts before the pod's network is set up
//!   and recorded; until then the containers wait in `ContainerCreating` with the reason.

pub mod exec;
pub mod expansion;
pub mod logs;
pub mod multus;
pub mod network;
pub mod orphans;
pub mod probes;
pub mod process;
pub mod status;
pub mod volumes;

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
use volumes::projection::SourceKind;

/// How the runner is set up.
#[derive(Clone, Debug)]
pub struct PodRunnerConfig {
    /// The node whose pods this runner runs.
    pub node_name: String,
    /// Per-pod state directories live here (`<state_dir>/<pod uid>/`).
    pub state_dir: PathBuf,
    /// What images this node runs.
    pub images: crate::images::ImageStore,
    /// The address reported as the pods' host IP (and pod IP of pods that share the host's
    /// network).
    pub host_ip: String,
    /// Where pods reach the API server (`KUBERNETES_SERVICE_HOST`/`_PORT` in every container).
    pub kubernetes_service: Option<(String, u16)>,
    /// The node's pod network; `None`: every pod shares the host's network.
    pub network: Option<network::PodNetworks>,
    /// Where `hostPath` volumes are on this machine.
    pub host_paths: crate::host_paths::HostPathMap,
}

/// The host name of a pod with a network of its own, as kubelet gives it: `spec.hostname`, else
/// the pod's name, cut to 63 characters (a DNS label).
/// Where the container's `exec` probes run: its main process `pid`, the image's programs
/// for the probes' commands, the image's environment and the container's plain `env` values
/// (kubelet execs with the container's whole environment; references to Secrets and fields
/// are left out here).
fn exec_target(
    images: &crate::images::ImageStore,
    container: &k8s_openapi::api::core::v1::Container,
    pid: i32,
) -> exec::ExecTarget {
    let image = container.image.clone().unwrap_or_default();
    let mut target = exec::ExecTarget {
        pid,
        ..exec::ExecTarget::default()
    };
    let probes = [
        &container.startup_probe,
        &container.readiness_probe,
        &container.liveness_probe,
    ];
    for command in probes
        .into_iter()
        .flatten()
        .filter_map(|p| p.exec.as_ref()?.command.as_ref()?.first())
    {
        if let Ok(resolved) = images.resolve(&image, std::slice::from_ref(command), &[]) {
            target.env.clone_from(&resolved.env);
            target.programs.insert(command.clone(), resolved.program);
        }
    }
    target.env.extend(
        container
            .env
            .iter()
            .flatten()
            .filter_map(|e| Some((e.name.clone(), e.value.clone()?))),
    );
    target
}

fn pod_hostname(pod: &Pod) -> String {
    let spec_hostname = pod.spec.as_ref().and_then(|s| s.hostname.clone());
    let name = spec_hostname
        .filter(|h| !h.is_empty())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['-', '.'])
        .to_owned()
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
    /// Releasing the pod's network (CNI DEL, namespace) failed; its removal is retried.
    #[error("releasing the network of pod {pod}")]
    Network {
        pod: String,
        #[source]
        source: network::NetworkError,
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
    /// When SIGTERM was sent to a deleting pod's containers: pod uid → SIGKILL deadline.
    kill_deadlines: BTreeMap<String, Instant>,
    /// The status last sent per pod uid, with the pod's resourceVersion the cache showed when
    /// it was sent: while the cache still shows that version, the write has not come back
    /// yet and is not repeated.
    reported: BTreeMap<String, (Option<String>, serde_json::Value)>,
    /// Pods removed from the API (deleted, or found gone) whose removal the cache has not
    /// shown yet: pod uid → when. Until the cache drops them, or [`REMOVAL_RETRY`] passes,
    /// they are not stopped, released or deleted again.
    removed: BTreeMap<String, Instant>,
    /// Containers waiting to be restarted: (pod uid, container) → when.
    restart_at: BTreeMap<(String, String), Instant>,
    /// Containers whose image could not be resolved once already (the next report says
    /// `ImagePullBackOff`, as kubelet alternates).
    pull_failed: BTreeSet<(String, String)>,
    /// The pods' volumes: set-up, resync, service-account tokens.
    volumes: volumes::VolumeManager,
    exits: mpsc::UnboundedSender<()>,
    /// The containers' probe workers.
    probes: probes::Prober,
    /// Containers stopped for a failed liveness or startup probe: (pod uid, container) →
    /// (pid, when its group is killed).
    probe_kills: BTreeMap<(String, String), (i32, Instant)>,
    /// The `network-status` annotation last written per pod uid, with the resourceVersion the
    /// cache showed then (not written again until the cache moved on).
    network_status: BTreeMap<String, (Option<String>, String)>,
    /// Pids of containers this runner started and whose waiter has not recorded the exit yet:
    /// such a process that is gone has an exit code on its way, not an unknown one.
    waited: Arc<std::sync::Mutex<BTreeSet<i32>>>,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// kubelet's container restart back-off: 10 s, doubling per restart, at most 5 minutes.
pub fn restart_backoff(restart_count: u32) -> Duration {
    Duration::from_secs(10u64.saturating_mul(1 << restart_count.min(5)).min(300))
}

/// Whether `restart_policy` restarts a container that exited with `exit_code`.
pub fn restarts(restart_policy: &str, exit_code: i32) -> bool {
    match restart_policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

impl PodRunner {
    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.config.state_dir.join(uid)
    }

    /// Reconciles one pod bound to this node.
    async fn reconcile(&mut self, pod: &Pod) -> Result<(), PodRunnerError> {
        let Some(uid) = pod.metadata.uid.clone() else {
            return Ok(());
        };
        let Some(spec) = &pod.spec else { return Ok(()) };
        if pod.metadata.deletion_timestamp.is_some() {
            if self
                .removed
                .get(&uid)
                .is_some_and(|at| at.elapsed() < REMOVAL_RETRY)
            {
                return Ok(());
            }
            return self.stop_and_remove(pod, &uid).await;
        }
        let pod_dir = self.pod_dir(&uid);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminal = matches!(phase, Some("Succeeded" | "Failed"));
        let prepared = if terminal {
            Ok(Prepared::default())
        } else {
            self.prepare(pod, &uid).await
        };
        let mut reports = Vec::with_capacity(spec.containers.len());
        for container in &spec.containers {
            let state = match &prepared {
                Ok(prepared) => {
                    self.container_state(pod, &uid, container, prepared, terminal)
                        .await?
                }
                Err(message) => ContainerState::Waiting {
                    reason: "ContainerCreating".into(),
                    message: Some(message.clone()),
                },
            };
            let restart_count = process::read_json::<ProcessRecord>(
                &ContainerPaths::new(&pod_dir, &container.name).record,
            )
            .map_or(0, |r| r.restart_count);
            let mut report = status::ContainerReport::new(
                container.name.clone(),
                container.image.clone().unwrap_or_default(),
                state,
                restart_count,
            );
            self.apply_probes(pod, &uid, container, &mut report);
            reports.push(report);
        }
        if terminal
            && !reports
                .iter()
                .any(|r| matches!(r.state, ContainerState::Running { .. }))
        {
            // As kubelet stops a finished pod's sandbox: its address goes back to the pool.
            self.release_network(pod, &uid).await?;
        }
        let pod_ip = self.pod_ip(pod, &uid);
        self.report(pod, &reports, &pod_ip).await
    }

    /// Sets `started` and `ready` of a running container from its probes, and stops it when a
    /// liveness or startup probe failed (kubelet's kill: `SIGTERM`, `SIGKILL` of its group
    /// after the grace period); its exit then takes the restart path of any exit.
    fn apply_probes(
        &mut self,
        pod: &Pod,
        uid: &str,
        container: &k8s_openapi::api::core::v1::Container,
        report: &mut status::ContainerReport,
    ) {
        let key = (uid.to_owned(), container.name.clone());
        let ContainerState::Running { started_at, pid } = &report.state else {
            self.probes.stop(uid, &container.name);
            self.probe_kills.remove(&key);
            return;
        };
        let pod_ip = self.pod_ip(pod, uid);
        let images = &self.config.images;
        let probed = self
            .probes
            .observe(uid, container, *pid, started_at, &pod_ip, || {
                exec_target(images, container, *pid)
            });
        report.started = probed.started;
        report.ready = probed.ready;
        let Some(message) = probed.restart else {
            return;
        };
        let paths = ContainerPaths::new(&self.pod_dir(uid), &container.name);
        let Some(record) = process::read_json::<ProcessRecord>(&paths.record) else {
            return;
        };
        match self.probe_kills.get(&key) {
            Some((killed_pid, deadline)) if *killed_pid == record.pid => {
                if Instant::now() >= *deadline {
                    process::signal_group(&record, Signal::SIGKILL);
                }
            }
            _ => {
                info!(pod = %pod_key(pod), "{message}");
                let grace = container
                    .liveness_probe
                    .as_ref()
                    .and_then(|p| p.termination_grace_period_seconds)
                    .or_else(|| {
                        pod.spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds)
                    })
                    .unwrap_or(30)
                    .max(0);
                process::signal_main(&record, Signal::SIGTERM);
                let deadline =
                    Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                self.probe_kills.insert(key, (record.pid, deadline));
            }
        }
    }

    /// The pod's volumes and network, ready for its containers; the message of what failed
    /// (the containers then wait in `ContainerCreating`).
    async fn prepare(&mut self, pod: &Pod, uid: &str) -> Result<Prepared, String> {
        let mounts = self.prepare_pod(pod, uid).await.map_err(|e| e.message())?;
        let netns = match self.network_of(pod) {
            None => None,
            Some(networks) => {
                let networks = networks.clone();
                let (set_up, owned_uid, pod_dir) =
                    (networks.clone(), uid.to_owned(), self.pod_dir(uid));
                let ports = network::port_mappings(pod);
                let record = tokio::task::spawn_blocking(move || {
                    set_up.set_up(&owned_uid, &pod_dir, &ports)
                })
                .await
                .map_err(|e| format!("setting up the pod network: {e}"))?
                .map_err(|e| format!("Failed to create pod sandbox: {}", error_chain(&e)))?;
                self.sync_secondary_networks(pod, uid, &networks, &record)
                    .await?;
                Some(record.netns)
            }
        };
        Ok(Prepared { mounts, netns })
    }

    /// The pod's secondary networks as its annotation asks ([`multus`]), and their
    /// `network-status`. A failure keeps a pod whose containers never started in
    /// `ContainerCreating` (as Multus fails the sandbox); a running pod keeps running and the
    /// change is retried on the next pass.
    async fn sync_secondary_networks(
        &mut self,
        pod: &Pod,
        uid: &str,
        networks: &network::PodNetworks,
        record: &network::NetworkRecord,
    ) -> Result<(), String> {
        let annotations = pod.metadata.annotations.as_ref();
        let asks = annotations.is_some_and(|a| {
            a.contains_key(multus::NETWORKS_ANNOTATION)
                || a.contains_key(multus::NETWORK_STATUS_ANNOTATION)
        });
        let pod_dir = self.pod_dir(uid);
        if !asks && !pod_dir.join(multus::SECONDARY_RECORD_FILE).exists() {
            return Ok(());
        }
        let (status, synced) = multus::sync(&self.client, networks, pod, &pod_dir, record).await;
        let current = annotations.and_then(|a| a.get(multus::NETWORK_STATUS_ANNOTATION));
        let version = pod.metadata.resource_version.clone();
        let sent = self
            .network_status
            .get(uid)
            .is_some_and(|(rv, value)| *rv == version && *value == status);
        if current != Some(&status) && !sent {
            let patch =
                json!({"metadata": {"annotations": {multus::NETWORK_STATUS_ANNOTATION: status}}});
            let api: Api<Pod> = Api::namespaced(
                self.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.network_status
                        .insert(uid.to_owned(), (version, status));
                }
                Err(e) => {
                    warn!(pod = %pod_key(pod), error = %e, "writing the network status failed")
                }
            }
        }
        let started = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .any(|c| ContainerPaths::new(&pod_dir, &c.name).record.exists());
        match synced {
            Err(message) if !started => Err(message),
            _ => Ok(()),
        }
    }

    /// The pod network this pod joins: `None` for `hostNetwork` pods and on a node without one.
    fn network_of(&self, pod: &Pod) -> Option<&network::PodNetworks> {
        self.config
            .network
            .as_ref()
            .filter(|_| !network::host_network(pod))
    }

    /// `status.podIP`: the node's address for pods in its network, the CNI result's otherwise
    /// (empty until the network is set up).
    fn pod_ip(&self, pod: &Pod, uid: &str) -> String {
        match self.network_of(pod) {
            None => self.config.host_ip.clone(),
            Some(_) => network::read_record(&self.pod_dir(uid))
                .and_then(|r| r.pod_ip())
                .unwrap_or_default(),
        }
    }

    /// CNI DEL and namespace deletion for the pod (nothing to do for a pod that has no network
    /// or had it released already).
    async fn release_network(&self, pod: &Pod, uid: &str) -> Result<(), PodRunnerError> {
        let Some(networks) = self.config.network.clone() else {
            return Ok(());
        };
        let (uid, pod_dir) = (uid.to_owned(), self.pod_dir(uid));
        let released =
            tokio::task::spawn_blocking(move || networks.tear_down(&uid, &pod_dir)).await;
        match released {
            Ok(result) => result.map_err(|source| PodRunnerError::Network {
                pod: pod_key(pod),
                source,
            }),
            Err(e) => {
                warn!(pod = %pod_key(pod), error = %e, "the pod network release task failed");
                Ok(())
            }
        }
    }

    /// Writes the pod's reference and prepares its volumes; returns the host path of each
    /// volume by name.
    async fn prepare_pod(
        &mut self,
        pod: &Pod,
        uid: &str,
    ) -> Result<BTreeMap<String, PathBuf>, volumes::VolumeError> {
        let pod_dir = self.pod_dir(uid);
        let pod_ref = orphans::PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
        };
        if !pod_dir.join(orphans::POD_REF_FILE).exists() {
            orphans::write_pod_ref(&pod_dir, &pod_ref).map_err(|source| volumes::VolumeError {
                volume: String::new(),
                cause: volumes::SetUpError::Io {
                    path: pod_dir.join(orphans::POD_REF_FILE),
                    source,
                },
            })?;
        }
        self.volumes.prepare(pod, &pod_dir).await
    }

    /// The state of one container, starting or restarting it when it should run.
    async fn container_state(
        &mut self,
        pod: &Pod,
        uid: &str,
        container: &k8s_openapi::api::core::v1::Container,
        prepared: &Prepared,
        terminal: bool,
    ) -> Result<ContainerState, PodRunnerError> {
        let paths = ContainerPaths::new(&self.pod_dir(uid), &container.name);
        let record: Option<ProcessRecord> = process::read_json(&paths.record);
        let alive = record.as_ref().is_some_and(process::is_alive);
        let key = (uid.to_owned(), container.name.clone());
        let exit_on_its_way = record.as_ref().is_some_and(|r| {
            self.waited
                .lock()
                .is_ok_and(|waited| waited.contains(&r.pid))
        });
        if let (Some(record), true) = (&record, alive || exit_on_its_way) {
            cap_log(&paths.log).await;
            return Ok(ContainerState::Running {
                started_at: record.started_at.clone(),
                pid: record.pid,
            });
        }
        let exit = match (&record, process::read_json::<ExitRecord>(&paths.exit)) {
            (_, Some(exit)) => Some(exit),
            (Some(_), None) => {
                // Our record, no exit file, process gone: we were not its parent (restart).
                let exit = ExitRecord {
                    exit_code: 137,
                    reason: "ContainerStatusUnknown".into(),
                    finished_at: crate::now_rfc3339(),
                };
                process::record_exit(&paths, &exit);
                Some(exit)
            }
            (None, None) => None,
        };
        let restart_count = record.as_ref().map_or(0, |r| r.restart_count);
        if let Some(exit) = exit {
            if terminal || !restarts(restart_policy(pod), exit.exit_code) {
                return Ok(terminated(record.as_ref(), exit));
            }
            let when = *self
                .restart_at
                .entry(key.clone())
                .or_insert_with(|| Instant::now() + restart_backoff(restart_count));
            if Instant::now() < when {
                return Ok(ContainerState::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: Some(format!(
                        "back-off restarting failed container {} in pod {}",
                        container.name,
                        pod_key(pod)
                    )),
                });
            }
            self.restart_at.remove(&key);
            return self
                .start(pod, uid, container, prepared, &paths, restart_count + 1)
                .await;
        }
        if terminal {
            return Ok(ContainerState::Waiting {
                reason: "PodCompleted".into(),
                message: None,
            });
        }
        self.start(pod, uid, container, prepared, &paths, 0).await
    }

    /// The container's environment (empty for an image the store does not know: that one
    /// fails with `ErrImagePull` first); `CreateContainerConfigError` when it cannot be built.
    async fn container_env(
        &self,
        pod: &Pod,
        uid: &str,
        container: &k8s_openapi::api::core::v1::Container,
        image: &str,
    ) -> Result<Vec<(String, String)>, ContainerState> {
        if !self.config.images.contains(image) {
            return Ok(Vec::new());
        }
        let service = self
            .config
            .kubernetes_service
            .as_ref()
            .map(|(host, port)| (host.as_str(), *port));
        let pod_ip = self.pod_ip(pod, uid);
        self.volumes
            .container_env(pod, container, service, &pod_ip)
            .await
            .map_err(|e| ContainerState::Waiting {
                reason: "CreateContainerConfigError".into(),
                message: Some(e.to_string()),
            })
    }

    async fn start(
        &mut self,
        pod: &Pod,
        uid: &str,
        container: &k8s_openapi::api::core::v1::Container,
        prepared: &Prepared,
        paths: &ContainerPaths,
        restart_count: u32,
    ) -> Result<ContainerState, PodRunnerError> {
        let key = (uid.to_owned(), container.name.clone());
        let image = container.image.clone().unwrap_or_default();
        // As kubelet: the image first (`ErrImagePull`), then the container's configuration
        // (`CreateContainerConfigError`), whose environment expands `command` and `args`.
        let container_env = match self.container_env(pod, uid, container, &image).await {
            Ok(env) => env,
            Err(waiting) => return Ok(waiting),
        };
        let command = expansion::expand_all(
            container.command.as_deref().unwrap_or_default(),
            &container_env,
        );
        let args = expansion::expand_all(
            container.args.as_deref().unwrap_or_default(),
            &container_env,
        );
        let resolved = match self.config.images.resolve(&image, &command, &args) {
            Ok(r) => r,
            Err(crate::images::ImageError::NotFound(_)) => {
                let again = !self.pull_failed.insert(key);
                return Ok(ContainerState::Waiting {
                    reason: if again {
                        "ImagePullBackOff"
                    } else {
                        "ErrImagePull"
                    }
                    .into(),
                    message: Some(if again {
                        format!("Back-off pulling image \"{image}\"")
                    } else {
                        format!("Failed to pull image \"{image}\": not in this node's image store")
                    }),
                });
            }
            Err(e) => {
                let exit = ExitRecord {
                    exit_code: 128,
                    reason: "StartError".into(),
                    finished_at: crate::now_rfc3339(),
                };
                warn!(pod = %pod_key(pod), container = %container.name, error = %e, "container cannot start");
                process::record_exit(paths, &exit);
                return Ok(terminated(None, exit));
            }
        };
        self.pull_failed.remove(&key);
        let mut env = resolved.env.clone();
        env.extend(container_env);
        let sandbox = process::Sandbox {
            argv0: Some(resolved.argv0.clone()),
            mounts: volumes::bind_mounts(
                container,
                &prepared.mounts,
                &volumes::read_only_volumes(pod),
            )
            .into_iter()
            .chain(volumes::device_mounts(container, &prepared.mounts))
            .collect(),
            netns: prepared.netns.clone(),
            hostname: prepared.netns.as_ref().map(|_| pod_hostname(pod)),
        };
        let (mut child, record) = process::spawn(
            &resolved.program,
            &resolved.args,
            &env,
            paths,
            &sandbox,
            restart_count,
        )
        .await
        .map_err(|source| PodRunnerError::Start {
            pod: pod_key(pod),
            source,
        })?;
        info!(pod = %pod_key(pod), container = %container.name, pid = record.pid, "started container");
        let exits = self.exits.clone();
        let waiter_paths = paths.clone();
        let waiter_record = record.clone();
        let waited = self.waited.clone();
        if let Ok(mut pids) = waited.lock() {
            pids.insert(record.pid);
        }
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                // As a container runtime: when the main process ends, nothing of the
                // container outlives it.
                process::signal_group(&waiter_record, Signal::SIGKILL);
                process::record_exit(&waiter_paths, &process::exit_from_status(status));
            }
            if let Ok(mut pids) = waited.lock() {
                pids.remove(&waiter_record.pid);
            }
            let _ = exits.send(());
        });
        Ok(ContainerState::Running {
            started_at: record.started_at,
            pid: record.pid,
        })
    }

    async fn report(
        &mut self,
        pod: &Pod,
        containers: &[status::ContainerReport],
        pod_ip: &str,
    ) -> Result<(), PodRunnerError> {
        let now = crate::now_rfc3339();
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .and_then(|t| serde_json::to_value(t).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| now.clone());
        let status_with = |gates_ready: bool| {
            status::pod_status(
                containers,
                restart_policy(pod),
                gates_ready,
                &self.config.host_ip,
                pod_ip,
                &start_time,
                &now,
            )
        };
        let mut wanted = status_with(readiness_gates_true(pod));
        let current = pod
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok());
        if status::same_report(current.as_ref(), &wanted) {
            return Ok(());
        }
        // About to write: a gate the pass's copy of the pod did not show yet is not reported
        // missing (see `gate_set_meanwhile`).
        if self.gate_set_meanwhile(pod, containers).await {
            wanted = status_with(true);
            if status::same_report(current.as_ref(), &wanted) {
                return Ok(());
            }
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
        tracing::debug!(pod = %pod_key(pod), status = %wanted, "reporting the pod status");
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

    /// Whether the pod's readiness gates, false in the pass's copy of the pod, hold by now.
    /// That copy may be older than a gate's condition (virt-controller sets
    /// `kubevirt.io/virtual-machine-unpaused` right after the binding, while the network was
    /// being set up). Only when a status is about to be written, the containers are ready
    /// and only a gate stands between the pod and `Ready`, is the pod read again (kubelet's
    /// status manager reads the pod before it writes): one read instead of a `Ready=False`
    /// write followed by a `Ready=True` one.
    async fn gate_set_meanwhile(&self, pod: &Pod, containers: &[status::ContainerReport]) -> bool {
        if readiness_gates_true(pod)
            || containers.is_empty()
            || !containers.iter().all(status::ContainerReport::is_ready)
        {
            return false;
        }
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        match api
            .get_opt(pod.metadata.name.as_deref().unwrap_or_default())
            .await
        {
            Ok(Some(fresh)) if fresh.metadata.uid == pod.metadata.uid => {
                readiness_gates_true(&fresh)
            }
            _ => false,
        }
    }

    /// kubelet's stop: `SIGTERM` to each container's main process, `SIGKILL` to what is left
    /// of its process group once the grace period is over; when nothing runs, the pod is
    /// removed.
    async fn stop_and_remove(&mut self, pod: &Pod, uid: &str) -> Result<(), PodRunnerError> {
        self.probes.stop_pod(uid);
        let pod_dir = self.pod_dir(uid);
        let records: Vec<ProcessRecord> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| process::read_json(&ContainerPaths::new(&pod_dir, &c.name).record))
            .filter(process::group_alive)
            .collect();
        if !records.is_empty() {
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .unwrap_or(30)
                .max(0);
            match self.kill_deadlines.get(uid) {
                None => {
                    info!(pod = %pod_key(pod), grace, "stopping the pod's containers");
                    for record in &records {
                        process::signal_main(record, Signal::SIGTERM);
                    }
                    let deadline =
                        Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                    self.kill_deadlines.insert(uid.to_owned(), deadline);
                }
                Some(deadline) if Instant::now() >= *deadline => {
                    for record in &records {
                        process::signal_group(record, Signal::SIGKILL);
                    }
                }
                Some(_) => {
                    // A main process that ended leaves nothing of its container behind.
                    for record in records.iter().filter(|r| !process::is_alive(r)) {
                        process::signal_group(record, Signal::SIGKILL);
                    }
                }
            }
            return Ok(());
        }
        self.kill_deadlines.remove(uid);
        // As kubelet: the sandbox (here the network namespace and its address) goes once the
        // containers have stopped, before the pod object does.
        self.release_network(pod, uid).await?;
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
        let _ = std::fs::remove_dir_all(pod_dir);
        self.removed.insert(uid.to_owned(), Instant::now());
        Ok(())
    }
}

/// Rotates a running container's log past [`MAX_LOG_BYTES`] (keeping five files), as kubelet
/// caps container logs; the size check is one `stat`, the copy runs off the runtime threads.
async fn cap_log(log: &std::path::Path) {
    use private_fs::log_rotation::{MAX_LOG_BYTES, rotate_if_larger};
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

/// What a pod's containers start with: the volumes by name and the pod's network namespace.
#[derive(Debug, Default)]
struct Prepared {
    mounts: BTreeMap<String, PathBuf>,
    /// `None`: the host's network.
    netns: Option<PathBuf>,
}

/// `error` and its sources, `: `-separated, for a status message.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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

/// How long a removed pod that the cache still shows is left alone before its removal is
/// tried again (its watch event is normally a few milliseconds away).
const REMOVAL_RETRY: Duration = Duration::from_secs(10);

/// Which pods the next pass reconciles.
enum Wake {
    /// Every pod of the node.
    All,
    /// The pods with these uids (watch events named them).
    Some(BTreeSet<String>),
}

impl Wake {
    fn note(&mut self, event: &watcher::Event<Pod>) {
        let Wake::Some(uids) = self else { return };
        match event {
            watcher::Event::Apply(pod)
            | watcher::Event::Delete(pod)
            | watcher::Event::InitApply(pod) => {
                if let Some(uid) = &pod.metadata.uid {
                    uids.insert(uid.clone());
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => *self = Wake::All,
        }
    }

    fn includes(&self, pod: &Pod) -> bool {
        match self {
            Wake::All => true,
            Wake::Some(uids) => pod.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)),
        }
    }
}

/// `(kind, namespace, name)` of every object of `K` that changes or goes away after the
/// initial list (which the volumes read when they are set up).
fn source_changes<K>(
    client: &kube::Client,
    kind: SourceKind,
) -> impl futures::Stream<Item = (SourceKind, String, String)> + use<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let changed = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                    let meta = o.meta();
                    Some((
                        kind,
                        meta.namespace.clone().unwrap_or_default(),
                        meta.name.clone().unwrap_or_default(),
                    ))
                }
                _ => None,
            };
            std::future::ready(changed)
        })
}

/// Polls the pod watch for what is ready (which updates the reflector's store) and notes it
/// in `wake`; returns the pods that became terminating.
fn take_in_events(
    events: &mut (impl futures::Stream<Item = watcher::Result<watcher::Event<Pod>>> + Unpin),
    wake: &mut Wake,
) -> Vec<Pod> {
    let mut terminating = Vec::new();
    while let Some(Some(event)) = futures::FutureExt::now_or_never(events.next()) {
        if let Ok(event) = event {
            wake.note(&event);
            if let watcher::Event::Apply(pod) = event
                && pod.metadata.deletion_timestamp.is_some()
            {
                terminating.push(pod);
            }
        }
    }
    terminating
}

impl PodRunner {
    /// Reconciles `pod`; a failure is logged and retried with the next pass over every pod
    /// (at the latest the tick's).
    async fn reconcile_or_retry(&mut self, pod: &Pod, wake: &mut Wake) {
        if let Err(e) = self.reconcile(pod).await {
            warn!(error = %error_chain(&e), "pod runner pass failed; retrying");
            *wake = Wake::All;
        }
    }
}

/// Runs the pod runner until the future is dropped.
pub async fn run(client: kube::Client, config: PodRunnerConfig) {
    let (exits_tx, mut exits_rx) = mpsc::unbounded_channel();
    let volumes = volumes::VolumeManager::new(
        client.clone(),
        config.host_ip.clone(),
        config.host_paths.clone(),
    );
    let mut runner = PodRunner {
        config,
        client: client.clone(),
        kill_deadlines: BTreeMap::new(),
        reported: BTreeMap::new(),
        removed: BTreeMap::new(),
        restart_at: BTreeMap::new(),
        pull_failed: BTreeSet::new(),
        volumes,
        probes: probes::Prober::new(exits_tx.clone()),
        probe_kills: BTreeMap::new(),
        network_status: BTreeMap::new(),
        exits: exits_tx,
        waited: Arc::default(),
    };
    let mut orphans = orphans::Orphans::new(runner.config.state_dir.clone())
        .with_network(runner.config.network.clone());
    let api: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", runner.config.node_name);
    let (store, writer) = reflector::store::<Pod>();
    let mut events = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .reflect(writer)
        .boxed();
    // Changes of configMaps and secrets, so that the volumes filled from them follow at once.
    let sources = futures::stream::select(
        source_changes::<k8s_openapi::api::core::v1::ConfigMap>(&client, SourceKind::ConfigMap),
        source_changes::<k8s_openapi::api::core::v1::Secret>(&client, SourceKind::Secret),
    );
    let mut sources = std::pin::pin!(sources);
    // Re-adopted processes are not our children: poll them (and grace deadlines, restart
    // back-offs, volume resyncs) periodically with a pass over every pod.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // kubelet's pod workers: a watch event wakes the pod it names only, so a burst of N pods
    // costs N reconciles, not N passes over N pods; exits, probe results and the tick wake all.
    let mut wake = Wake::All;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(event)) => wake.note(&event),
                Some(Err(_)) => {}
            },
            Some((kind, namespace, name)) = sources.next() => {
                for pod in store.state() {
                    let here = pod.metadata.namespace.as_deref() == Some(namespace.as_str());
                    if here && volumes::uses_source(&pod, kind, &name)
                        && let Some(uid) = &pod.metadata.uid
                    {
                        runner.volumes.invalidate(uid);
                        if let Wake::Some(uids) = &mut wake {
                            uids.insert(uid.clone());
                        }
                    }
                }
            }
            _ = exits_rx.recv() => wake = Wake::All,
            _ = tick.tick() => wake = Wake::All,
        }
        while let Some(Some(event)) = futures::FutureExt::now_or_never(events.next()) {
            if let Ok(event) = event {
                wake.note(&event);
            }
        }
        // Not ready until the initial list is in; blocking here would stop the watcher.
        match futures::FutureExt::now_or_never(store.wait_until_ready()) {
            None => continue,
            Some(Err(_)) => return,
            Some(Ok(())) => {}
        }
        let pods: Vec<Arc<Pod>> = store.state();
        let known: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let woken = std::mem::replace(&mut wake, Wake::Some(BTreeSet::new()));
        let mut queue: Vec<Arc<Pod>> = pods.into_iter().filter(|p| woken.includes(p)).collect();
        // Terminating pods first: stopping one is quick and must not wait behind starts.
        queue.sort_by_key(|p| p.metadata.deletion_timestamp.is_none());
        for pod in queue {
            // A pass over many pods takes a while: take in what the watch delivered
            // meanwhile, stop the pods deleted since at once, and reconcile each pod as it is
            // now, never a copy from before its deletion.
            for deleted in take_in_events(&mut events, &mut wake) {
                runner.reconcile_or_retry(&deleted, &mut wake).await;
            }
            if let Some(pod) = store.get(&reflector::ObjectRef::from_obj(pod.as_ref())) {
                runner.reconcile_or_retry(&pod, &mut wake).await;
            }
        }
        runner.removed.retain(|uid, _| known.contains(uid));
        runner.reported.retain(|uid, _| known.contains(uid));
        runner.restart_at.retain(|(uid, _), _| known.contains(uid));
        runner.pull_failed.retain(|(uid, _)| known.contains(uid));
        runner.volumes.forget(&known);
        runner.probes.forget(&known);
        runner.probe_kills.retain(|(uid, _), _| known.contains(uid));
        // Only here, after the initial list: before it every pod would look missing.
        orphans
            .collect(&client, orphans::Cache::Synced(&known))
            .await;
    }
}
