//! Pod directories whose pod the runner does not know: confirm before killing, quarantine
//! instead of deleting.
//!
//! A pod directory `<state dir>/<pod uid>/` whose uid is not among the pods the informer shows
//! bound to this node is an *orphan candidate*. Its pod may really be gone (force-deleted while
//! the handler was down), but the same picture appears when the node was renamed (the
//! informer watches `spec.nodeName=<new name>`) or when the API's store was lost — and then
//! killing every launcher and deleting its disks would destroy every VM on the machine. So:
//!
//! - Nothing is done before the informer has synced ([`Cache::NotSynced`]).
//! - A directory without a live process is **quarantined**, never deleted: moved to
//!   `<state dir>/quarantine/<uid>` (then `<uid>.1`, `<uid>.2` …), with a warning naming it.
//!   An operator deletes it, or moves it back.
//! - A live launcher is stopped only when the API confirms its pod is gone: the runner records
//!   each pod's namespace and name in `pod.json` when it starts the container, and reads the
//!   pod by name. When it exists with the same uid (bound to another node name) the launcher
//!   is left running with a warning; when the read fails, or there is no `pod.json` (a
//!   directory made by an older runner), it is left running too. A confirmed orphan gets
//!   `SIGTERM` (the launcher powers the guest off), `SIGKILL` after [`ORPHAN_GRACE`], and is
//!   quarantined once its processes have ended.
//! - Before a directory without a live process is quarantined, its pod network is released
//!   (CNI DEL and its namespace deleted, [`super::network`]), so an orphan's address returns to
//!   the pool; when that fails the directory stays and the release is retried on the next pass.
//!
//! - No launcher is stopped while the informer shows *no* pod bound to this node: that is what
//!   a lost or replaced store, or a node renamed after its old pods were deleted, looks like
//!   (every pod confirmed gone at once). The launchers are left running with a loud warning
//!   naming each; an operator who really deleted every pod stops them by hand.
//!
//! # Caveats
//! - A store restored from an older backup, where this node still has some pods, is not
//!   recognised: launchers of pods missing from it are stopped (their disks stay in
//!   quarantine).
//! - Quarantine is not cleaned up automatically.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::process::{self, ProcessRecord};

/// The directory below the state directory where orphaned pod directories are moved.
pub const QUARANTINE_DIR: &str = "quarantine";
/// The file in a pod directory naming its pod.
pub const POD_REF_FILE: &str = "pod.json";
/// How long a confirmed orphan's launcher has between `SIGTERM` and `SIGKILL`.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// The pod a pod directory belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Records which pod `pod_dir` belongs to.
///
/// # Errors
/// The write error.
pub fn write_pod_ref(pod_dir: &Path, pod: &PodRef) -> std::io::Result<()> {
    private_fs::create_dir_all(pod_dir)?;
    process::write_json(&pod_dir.join(POD_REF_FILE), pod)
}

/// What the pod informer shows.
#[derive(Clone, Copy, Debug)]
pub enum Cache<'a> {
    /// The initial list has not completed: no pod is known to be missing.
    NotSynced,
    /// The uids of the pods bound to this node.
    Synced(&'a BTreeSet<String>),
}

/// What the API says of an unknown directory's pod.
#[derive(Debug, PartialEq, Eq)]
enum Lookup {
    /// The pod exists with this uid (bound to this node name or not).
    Exists(Option<String>),
    /// No pod of that name with that uid exists.
    Gone,
    /// Cannot tell (no `pod.json`, or the read failed).
    Unknown(String),
}

/// The orphan collector's state across passes.
#[derive(Debug)]
pub struct Orphans {
    state_dir: PathBuf,
    /// Confirmed orphans that were sent `SIGTERM`: uid → `SIGKILL` deadline.
    kill_deadlines: BTreeMap<String, Instant>,
    /// Uids already warned about (each warning is logged once).
    warned: BTreeSet<String>,
    /// The node's pod network: an orphan's is released (CNI DEL, namespace) before its
    /// directory is quarantined.
    network: Option<super::network::PodNetworks>,
}

impl Orphans {
    /// The collector of the pod directories below `state_dir`.
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            state_dir,
            kill_deadlines: BTreeMap::new(),
            warned: BTreeSet::new(),
            network: None,
        }
    }

    /// Releases the network of each orphan whose processes have all ended, before its directory
    /// is quarantined.
    #[must_use]
    pub fn with_network(mut self, network: Option<super::network::PodNetworks>) -> Self {
        self.network = network;
        self
    }

    /// CNI DEL and namespace deletion for an orphan; whether it succeeded (or there was
    /// nothing to release).
    async fn release_network(&mut self, uid: &str, dir: &Path) -> bool {
        let Some(network) = self.network.clone() else {
            return true;
        };
        let (owned_uid, owned_dir) = (uid.to_owned(), dir.to_path_buf());
        let released =
            tokio::task::spawn_blocking(move || network.tear_down(&owned_uid, &owned_dir)).await;
        match released {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                let detail = super::error_chain(&e);
                self.warn_once(
                    uid,
                    "cannot release the network of a stopped orphan; retrying before quarantining it",
                    &detail,
                );
                false
            }
            Err(e) => {
                self.warn_once(uid, "the network release task failed", &e.to_string());
                false
            }
        }
    }

    /// Where `uid`'s directory goes when it is quarantined (the first free name).
    fn quarantine_target(&self, uid: &str) -> PathBuf {
        let dir = self.state_dir.join(QUARANTINE_DIR);
        let mut target = dir.join(uid);
        let mut n = 1;
        while std::fs::symlink_metadata(&target).is_ok() {
            target = dir.join(format!("{uid}.{n}"));
            n += 1;
        }
        target
    }

    fn quarantine(&mut self, uid: &str, dir: &Path) {
        let target = self.quarantine_target(uid);
        let moved = private_fs::create_dir_all(&self.state_dir.join(QUARANTINE_DIR))
            .and_then(|()| std::fs::rename(dir, &target));
        match moved {
            Ok(()) => warn!(
                uid,
                to = %target.display(),
                "quarantined the directory of a pod that is not on this node (nothing deleted)"
            ),
            Err(e) => warn!(uid, error = %e, "cannot quarantine the directory of an unknown pod"),
        }
        self.kill_deadlines.remove(uid);
        self.warned.remove(uid);
    }

    fn warn_once(&mut self, uid: &str, message: &str, detail: &str) {
        if self.warned.insert(uid.to_owned()) {
            warn!(uid, detail, "{message}");
        }
    }

    /// One pass over the pod directories; see the module documentation for the rules.
    pub async fn collect(&mut self, client: &kube::Client, cache: Cache<'_>) {
        let Cache::Synced(known) = cache else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(&self.state_dir) else {
            return;
        };
        let mut candidates: Vec<(String, PathBuf)> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .filter(|(uid, _)| uuid::Uuid::try_parse(uid).is_ok() && !known.contains(uid))
            .collect();
        candidates.sort();
        let candidate_uids: BTreeSet<&String> = candidates.iter().map(|(uid, _)| uid).collect();
        self.kill_deadlines
            .retain(|uid, _| candidate_uids.contains(uid));
        self.warned.retain(|uid| candidate_uids.contains(uid));
        for (uid, dir) in candidates {
            let alive = live_processes(&dir);
            if alive.is_empty() {
                if self.release_network(&uid, &dir).await {
                    self.quarantine(&uid, &dir);
                }
                continue;
            }
            match lookup(client, &dir, &uid).await {
                Lookup::Exists(node) => self.warn_once(
                    &uid,
                    "the pod of this running launcher exists but is not bound to this node; leaving it running",
                    &format!("bound to {}", node.as_deref().unwrap_or("no node")),
                ),
                Lookup::Unknown(why) => self.warn_once(
                    &uid,
                    "cannot confirm that the pod of this running launcher is gone; leaving it running",
                    &why,
                ),
                Lookup::Gone if known.is_empty() => self.warn_once(
                    &uid,
                    "the pod of this running launcher is gone, but so is every pod of this node (a lost store or a renamed node?); leaving it running",
                    "stop it by hand if its pod was really deleted",
                ),
                Lookup::Gone => self.stop(&uid, &alive),
            }
        }
    }

    /// Stops the processes of a confirmed orphan: `SIGTERM`, then `SIGKILL` after the grace.
    fn stop(&mut self, uid: &str, alive: &[ProcessRecord]) {
        let signal = match self.kill_deadlines.get(uid) {
            None => {
                warn!(uid, "the pod of this running launcher is gone: stopping it");
                self.kill_deadlines
                    .insert(uid.to_owned(), Instant::now() + ORPHAN_GRACE);
                Signal::SIGTERM
            }
            Some(deadline) if Instant::now() >= *deadline => {
                info!(
                    uid,
                    "the launcher of a gone pod outlived its grace: killing it"
                );
                Signal::SIGKILL
            }
            Some(_) => return,
        };
        for record in alive {
            process::signal_group(record, signal);
        }
    }
}

/// The live processes recorded in `dir` (`<container>.json` files).
fn live_processes(dir: &Path) -> Vec<ProcessRecord> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| process::read_json::<ProcessRecord>(&p))
        .filter(process::is_alive)
        .collect()
}

/// Reads the pod `dir` belongs to by name and compares its uid.
async fn lookup(client: &kube::Client, dir: &Path, uid: &str) -> Lookup {
    let Some(pod_ref) = process::read_json::<PodRef>(&dir.join(POD_REF_FILE)) else {
        return Lookup::Unknown(format!("no readable {POD_REF_FILE}"));
    };
    if pod_ref.uid != uid {
        return Lookup::Unknown(format!("{POD_REF_FILE} names uid {}", pod_ref.uid));
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod_ref.namespace);
    match api.get_opt(&pod_ref.name).await {
        Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(uid) => {
            Lookup::Exists(pod.spec.and_then(|s| s.node_name))
        }
        Ok(_) => Lookup::Gone,
        Err(e) => Lookup::Unknown(format!(
            "reading pod {}/{}: {e}",
            pod_ref.namespace, pod_ref.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::process::ContainerPaths;
    use kube::api::PostParams;

    struct Fixture {
        tmp: tempfile::TempDir,
        _server: kubevirt_apiserver::RunningServer,
        client: kube::Client,
    }

    impl Fixture {
        async fn start() -> Fixture {
            let tmp = tempfile::tempdir().expect("tempdir");
            let server = kubevirt_apiserver::start(kubevirt_apiserver::Config {
                data_dir: tmp.path().join("apiserver"),
                listen: "127.0.0.1:0".parse().expect("addr"),
                initial_objects: vec![],
            })
            .await
            .expect("API server");
            let kubeconfig =
                kube::config::Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .expect("config");
            let client = kube::Client::try_from(config).expect("client");
            Fixture {
                tmp,
                _server: server,
                client,
            }
        }

        fn state_dir(&self) -> PathBuf {
            self.tmp.path().join("pods")
        }

        /// A pod directory for `pod` with a running launcher stand-in (`sleep`).
        async fn running_launcher(&self, pod: &PodRef, record_pod: bool) -> tokio::process::Child {
            let dir = self.state_dir().join(&pod.uid);
            if record_pod {
                write_pod_ref(&dir, pod).expect("pod.json");
            }
            let paths = ContainerPaths::new(&dir, "compute");
            let (child, _) = process::spawn(
                Path::new("/bin/sh"),
                &["-c".into(), "exec sleep 600".into()],
                &[],
                &paths,
                &process::Sandbox::default(),
                0,
            )
            .await
            .expect("spawn");
            child
        }

        async fn create_pod(&self, name: &str, node: &str) -> PodRef {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "x"}]},
            }))
            .expect("pod");
            let api: Api<Pod> = Api::namespaced(self.client.clone(), "default");
            let created = api
                .create(&PostParams::default(), &pod)
                .await
                .expect("create pod");
            PodRef {
                namespace: "default".into(),
                name: name.into(),
                uid: created.metadata.uid.expect("uid"),
            }
        }
    }

    fn missing_pod() -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: "virt-launcher-gone".into(),
            uid: uuid::Uuid::new_v4().to_string(),
        }
    }

    fn still_running(child: &mut tokio::process::Child) -> bool {
        child.try_wait().expect("try_wait").is_none()
    }

    #[tokio::test]
    async fn nothing_is_touched_before_the_informer_has_synced() {
        let f = Fixture::start().await;
        let mut launcher = f.running_launcher(&missing_pod(), true).await;
        let stopped = f.state_dir().join(uuid::Uuid::new_v4().to_string());
        std::fs::create_dir_all(stopped.join("disks")).expect("dir");
        let mut orphans = Orphans::new(f.state_dir());
        orphans.collect(&f.client, Cache::NotSynced).await;
        assert!(
            still_running(&mut launcher),
            "a launcher was killed before the sync"
        );
        assert!(
            stopped.join("disks").is_dir(),
            "a directory was moved before the sync"
        );
        let _ = launcher.kill().await;
    }

    #[tokio::test]
    async fn an_unknown_directory_without_a_live_process_is_quarantined_not_deleted() {
        let f = Fixture::start().await;
        let uid = uuid::Uuid::new_v4().to_string();
        let dir = f.state_dir().join(&uid);
        std::fs::create_dir_all(dir.join("disks")).expect("dir");
        std::fs::write(dir.join("disks/root.img"), "guest data").expect("disk");
        let mut orphans = Orphans::new(f.state_dir());
        orphans
            .collect(&f.client, Cache::Synced(&BTreeSet::new()))
            .await;
        assert!(!dir.exists());
        let kept = f.state_dir().join(QUARANTINE_DIR).join(&uid);
        assert_eq!(
            std::fs::read_to_string(kept.join("disks/root.img")).expect("quarantined disk"),
            "guest data"
        );
        // The same uid again (a second orphan of that name) gets a name of its own.
        std::fs::create_dir_all(&dir).expect("dir");
        orphans
            .collect(&f.client, Cache::Synced(&BTreeSet::new()))
            .await;
        assert!(
            f.state_dir()
                .join(QUARANTINE_DIR)
                .join(format!("{uid}.1"))
                .is_dir()
        );
        assert!(kept.join("disks/root.img").exists());
    }

    #[tokio::test]
    async fn a_launcher_whose_pod_is_bound_to_another_node_name_keeps_running() {
        let f = Fixture::start().await;
        let pod = f.create_pod("virt-launcher-renamed", "old-node-name").await;
        let mut launcher = f.running_launcher(&pod, true).await;
        let mut orphans = Orphans::new(f.state_dir());
        orphans
            .collect(&f.client, Cache::Synced(&BTreeSet::new()))
            .await;
        assert!(
            still_running(&mut launcher),
            "the launcher of an existing pod was stopped"
        );
        assert!(f.state_dir().join(&pod.uid).is_dir());
        let _ = launcher.kill().await;
    }

    #[tokio::test]
    async fn a_launcher_whose_pod_cannot_be_identified_keeps_running() {
        let f = Fixture::start().await;
        let pod = missing_pod();
        let mut launcher = f.running_launcher(&pod, false).await;
        let mut orphans = Orphans::new(f.state_dir());
        orphans
            .collect(&f.client, Cache::Synced(&BTreeSet::new()))
            .await;
        assert!(still_running(&mut launcher));
        assert!(f.state_dir().join(&pod.uid).is_dir());
        let _ = launcher.kill().await;
    }

    #[tokio::test]
    async fn no_launcher_is_stopped_while_no_pod_is_bound_to_this_node() {
        // A lost store: the pods of both launchers are gone, and the node has no pod at all.
        let f = Fixture::start().await;
        let (first, second) = (missing_pod(), missing_pod());
        let mut a = f.running_launcher(&first, true).await;
        let mut b = f.running_launcher(&second, true).await;
        let mut orphans = Orphans::new(f.state_dir());
        for _ in 0..2 {
            orphans
                .collect(&f.client, Cache::Synced(&BTreeSet::new()))
                .await;
        }
        assert!(still_running(&mut a) && still_running(&mut b));
        assert!(
            orphans.kill_deadlines.is_empty(),
            "no launcher was signalled"
        );
        assert!(f.state_dir().join(&first.uid).is_dir());
        assert!(f.state_dir().join(&second.uid).is_dir());
        let _ = a.kill().await;
        let _ = b.kill().await;
    }

    #[tokio::test]
    async fn a_launcher_whose_pod_is_confirmed_gone_is_stopped_and_its_directory_quarantined() {
        use std::os::unix::process::ExitStatusExt;
        let f = Fixture::start().await;
        let pod = missing_pod();
        let mut launcher = f.running_launcher(&pod, true).await;
        let mut orphans = Orphans::new(f.state_dir());
        // The node runs another pod: the store is not empty for this node.
        let other = BTreeSet::from([uuid::Uuid::new_v4().to_string()]);
        orphans.collect(&f.client, Cache::Synced(&other)).await;
        let status = launcher.wait().await.expect("wait");
        assert_eq!(status.signal(), Some(15), "stopped with SIGTERM first");
        assert!(
            f.state_dir().join(&pod.uid).is_dir(),
            "kept until it has stopped"
        );
        orphans.collect(&f.client, Cache::Synced(&other)).await;
        assert!(!f.state_dir().join(&pod.uid).exists());
        assert!(
            f.state_dir()
                .join(QUARANTINE_DIR)
                .join(&pod.uid)
                .join(POD_REF_FILE)
                .is_file()
        );
    }
}
