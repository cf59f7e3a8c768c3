//! One `kubevirt-rs server` under test: the process (testkit's `ServerProcess` on a temporary
//! data directory), an admin client, VMI and pod trackers fed by watches, API request
//! counters from `/metrics`, and process memory.
//!
//! # Guarantees
//! Dropping a [`Cluster`] kills every QEMU whose pid file lies under the data directory, then
//! (through `ServerProcess`) the server and every launcher process group, and removes the
//! data directory. The benchmark future owns its `Cluster`, so Ctrl-C (which drops that
//! future) cleans up too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use testkit::ServerProcess;

use super::procfs;

/// The namespace the benchmark's VMs live in.
pub const NAMESPACE: &str = "default";
/// Template label naming the VM, so VMIs and launcher pods can be mapped back to it.
pub const VM_LABEL: &str = "bench.kubevirt-rs.io/vm";

/// A wait gives up when its progress has not changed for this long.
pub const STALL: Duration = Duration::from_secs(60);

/// What the trackers saw of one VMI.
#[derive(Clone, Debug, Default)]
pub struct VmiSeen {
    pub phase: String,
    /// Running transition − creation, from `status.phaseTransitionTimestamps` (whole
    /// seconds, as Kubernetes timestamps are).
    pub to_running: Option<Duration>,
    /// When the watch first delivered the VMI as Running (millisecond resolution).
    pub running_seen: Option<Instant>,
}

/// State shared with the watch tasks, keyed by the VM name (template label).
#[derive(Default)]
pub struct Seen {
    pub vmis: HashMap<String, VmiSeen>,
    /// VMs that have a launcher pod.
    pub pods: HashSet<String>,
    /// First arrival of `(vm, label key, value)` on its pod.
    pub label_arrivals: HashMap<(String, String, String), Instant>,
}

pub struct Cluster {
    /// Declared before `server`: QEMUs are killed before the server and launchers.
    _qemu_guard: QemuGuard,
    pub server: ServerProcess,
    pub client: kube::Client,
    pub seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Kills the QEMUs recorded under a data directory on drop (they run in their own process
/// groups, so killing a launcher's group does not reach them).
struct QemuGuard(PathBuf);

impl Drop for QemuGuard {
    fn drop(&mut self) {
        for pid in qemu_pids(&self.0) {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The pids of the QEMUs whose pid files lie in launcher directories under `data_dir`.
fn qemu_pids(data_dir: &Path) -> Vec<u32> {
    pod_dirs(data_dir)
        .iter()
        .filter_map(|d| procfs::pid_from_file(&d.join(LAUNCHER_DIR_IN_POD_DIR).join("qemu.pid")))
        .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
        .collect()
}

/// KubeVirt's components, each the container of that name in its pods.
const COMPONENTS: [&str; 3] = ["virt-api", "virt-controller", "virt-handler"];

/// The launcher directory (the `public` emptyDir) inside a pod directory.
pub const LAUNCHER_DIR_IN_POD_DIR: &str = "volumes/kubernetes.io~empty-dir/public";

/// The embedded node's pod directories.
/// Every pod directory of every node (the first node's are in `DATA/node/pods`, the others'
/// in `DATA/nodes/<name>/pods`).
pub fn pod_dirs(data_dir: &Path) -> Vec<PathBuf> {
    let entries = |dir: PathBuf| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
    };
    std::iter::once(data_dir.join("node"))
        .chain(entries(data_dir.join("nodes")))
        .flat_map(|node| entries(node.join("pods")))
        .collect()
}

/// Memory of one launcher pod (KiB).
#[derive(Clone, Copy, Debug)]
pub struct LauncherMemory {
    /// The `compute` container's process (the launcher): VmRSS.
    pub rss_kib: u64,
    /// Its `RssAnon` (what is not file pages of its binary and libraries).
    pub anon_kib: u64,
    /// Its `Pss` (shared pages divided among the processes sharing them).
    pub pss_kib: u64,
    /// VmRSS of every container process of the pod, summed.
    pub pod_kib: u64,
}

pub fn vm_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachine",
    ))
}

fn vmi_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
    ))
}

impl Cluster {
    /// Starts `binary server` with `extra_args` and the trackers.
    pub async fn start(binary: &Path, extra_args: &[&str]) -> anyhow::Result<Cluster> {
        let server = ServerProcess::start(binary, "server", extra_args)?;
        let guard = QemuGuard(server.data_dir().to_owned());
        let client = server.client().await?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let cluster = Cluster {
            _qemu_guard: guard,
            tasks: vec![
                tokio::spawn(track_vmis(client.clone(), seen.clone())),
                tokio::spawn(track_pods(client.clone(), seen.clone())),
            ],
            server,
            client,
            seen,
        };
        // Ready once the KubeVirt CRDs are served and the webhooks answer.
        let vms: Api<DynamicObject> =
            Api::namespaced_with(cluster.client.clone(), NAMESPACE, &vm_resource());
        testkit::wait_until_async(Duration::from_secs(60), "the VM API", || {
            let vms = vms.clone();
            async move { vms.list(&Default::default()).await.ok().map(|_| ()) }
        })
        .await?;
        Ok(cluster)
    }

    pub fn data_dir(&self) -> &Path {
        self.server.data_dir()
    }

    /// Copies `server.log` and every pod's container logs (`<pod uid>-<container>.log`) into
    /// `dir`.
    pub fn save_logs(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::copy(self.data_dir().join("server.log"), dir.join("server.log"))
            .context("copying server.log")?;
        for pod in pod_dirs(self.data_dir()) {
            let uid = pod.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            for entry in std::fs::read_dir(&pod).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str().filter(|n| n.ends_with(".log")) else {
                    continue;
                };
                // Launcher logs are many and small; KubeVirt's components are what matters.
                if name.starts_with("compute") {
                    continue;
                }
                std::fs::copy(entry.path(), dir.join(format!("{uid}-{name}")))
                    .with_context(|| format!("copying {}", entry.path().display()))?;
            }
        }
        Ok(())
    }

    pub fn vms(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NAMESPACE, &vm_resource())
    }

    /// Server RSS in KiB.
    pub fn server_rss_kib(&self) -> u64 {
        self.server.pid().and_then(procfs::rss_kib).unwrap_or(0)
    }

    /// Of every live launcher pod (KiB): its `compute` process's RSS and `RssAnon`, and the
    /// RSS of all its containers' processes together (`compute` and `guest-console-log`).
    pub fn launcher_rss_kib(&self) -> Vec<LauncherMemory> {
        pod_dirs(self.data_dir())
            .iter()
            .filter_map(|d| {
                let pid = procfs::pid_from_file(&d.join("compute.json"))?;
                let console = procfs::pid_from_file(&d.join("guest-console-log.json"))
                    .and_then(procfs::rss_kib)
                    .unwrap_or(0);
                let rss = procfs::rss_kib(pid)?;
                Some(LauncherMemory {
                    rss_kib: rss,
                    anon_kib: procfs::rss_anon_kib(pid)?,
                    pss_kib: procfs::pss_kib(pid)?,
                    pod_kib: rss + console,
                })
            })
            .collect()
    }

    /// RSS (KiB) of each running KubeVirt component pod, by container name (`virt-api`,
    /// `virt-controller`, `virt-handler`): one entry per replica.
    pub fn component_rss_kib(&self) -> std::collections::BTreeMap<String, Vec<u64>> {
        let mut by_component = std::collections::BTreeMap::<String, Vec<u64>>::new();
        for dir in pod_dirs(self.data_dir()) {
            for component in COMPONENTS {
                if let Some(rss) = procfs::pid_from_file(&dir.join(format!("{component}.json")))
                    .and_then(procfs::rss_kib)
                {
                    by_component
                        .entry(component.to_owned())
                        .or_default()
                        .push(rss);
                }
            }
        }
        by_component
    }

    /// Memory of every live QEMU.
    pub fn qemu_memory(&self, guest_mib: u64) -> Vec<procfs::QemuMemory> {
        qemu_pids(self.data_dir())
            .into_iter()
            .filter_map(|pid| procfs::qemu_memory(pid, guest_mib))
            .collect()
    }

    /// The API server's request counters: `(verb, resource, subresource)` → count.
    pub async fn request_counts(&self) -> anyhow::Result<RequestCounts> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("metrics request")?;
        let text = self
            .client
            .request_text(request)
            .await
            .context("scraping /metrics")?;
        Ok(RequestCounts::parse(&text))
    }

    /// Waits until `done(seen)` holds, printing `what` and `progress(seen)` every 5 s. Gives
    /// up after `deadline`, or once `progress` has not changed for [`STALL`].
    pub async fn wait_for(
        &self,
        what: &str,
        deadline: Duration,
        done: impl Fn(&Seen) -> bool,
        progress: impl Fn(&Seen) -> String,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let mut last_report = Instant::now();
        let (mut last_progress, mut last_change) = (String::new(), Instant::now());
        loop {
            {
                let seen = self.seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                if done(&seen) {
                    return Ok(start.elapsed());
                }
                let now = progress(&seen);
                if now != last_progress {
                    (last_progress, last_change) = (now.clone(), Instant::now());
                }
                if last_report.elapsed() > Duration::from_secs(5) {
                    eprintln!("    … {what}: {now}");
                    last_report = Instant::now();
                }
                if start.elapsed() > deadline || last_change.elapsed() > STALL {
                    anyhow::bail!(
                        "gave up after {:.0} s waiting for {what} ({now}, no progress for {:.0} s)",
                        start.elapsed().as_secs_f64(),
                        last_change.elapsed().as_secs_f64()
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Request counters by `(verb, resource, subresource)`, summed over groups and codes.
#[derive(Clone, Debug, Default)]
pub struct RequestCounts(pub HashMap<(String, String, String), u64>);

impl RequestCounts {
    pub fn parse(text: &str) -> RequestCounts {
        let mut counts = HashMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_owned())
                    .unwrap_or_default()
            };
            let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
            *counts
                .entry((label("verb"), label("resource"), label("subresource")))
                .or_insert(0) += n;
        }
        RequestCounts(counts)
    }

    /// `self − before`.
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        RequestCounts(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(*before.0.get(k).unwrap_or(&0))))
                .collect(),
        )
    }

    /// `self + other`.
    pub fn plus(&self, other: &RequestCounts) -> RequestCounts {
        let mut sum = self.0.clone();
        for (k, v) in &other.0 {
            *sum.entry(k.clone()).or_insert(0) += v;
        }
        RequestCounts(sum)
    }

    /// Requests with `verb` on `resource` and exactly `subresource`.
    pub fn count_sub(&self, verb: &str, resource: &str, subresource: &str) -> u64 {
        self.0
            .iter()
            .filter(|((v, r, s), _)| v == verb && r == resource && s == subresource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests with `verb` on `resource` (any subresource).
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|((v, r, _), _)| v == verb && r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes by the control plane: every POST/PUT/PATCH/DELETE except the harness's own
    /// VM creates and deletes.
    pub fn control_plane_writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|((verb, resource, sub), _)| {
                let write = matches!(
                    verb.as_str(),
                    "POST" | "PUT" | "PATCH" | "DELETE" | "DELETECOLLECTION"
                );
                let harness = resource == "virtualmachines"
                    && sub.is_empty()
                    && matches!(verb.as_str(), "POST" | "DELETE");
                write && !harness
            })
            .map(|(_, n)| n)
            .sum()
    }
}

fn vm_name_of(labels: Option<&BTreeMap<String, String>>) -> Option<String> {
    labels.and_then(|l| l.get(VM_LABEL)).cloned()
}

fn vmi_seen(vmi: &DynamicObject) -> VmiSeen {
    let status = vmi.data.get("status");
    let phase = status
        .and_then(|s| s.get("phase"))
        .and_then(|p| p.as_str())
        .unwrap_or_default()
        .to_owned();
    let created = vmi.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let running = status
        .and_then(|s| s.get("phaseTransitionTimestamps"))
        .and_then(|t| t.as_array())
        .and_then(|ts| {
            ts.iter()
                .find(|t| t.get("phase").and_then(|p| p.as_str()) == Some("Running"))
        })
        .and_then(|t| t.get("phaseTransitionTimestamp"))
        .and_then(|t| t.as_str())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let to_running = match (created, running) {
        (Some(c), Some(r)) => {
            let d = r.as_millisecond() - c.as_millisecond();
            Some(Duration::from_millis(u64::try_from(d).unwrap_or(0)))
        }
        _ => None,
    };
    VmiSeen {
        phase,
        to_running,
        running_seen: None,
    }
}

async fn track_vmis(client: kube::Client, seen: Arc<Mutex<Seen>>) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &vmi_resource());
    let config = watcher::Config::default().labels(VM_LABEL);
    let mut stream = watcher(api, config).boxed();
    // A re-list replaces the map only once complete (no momentarily empty view).
    let mut relisted: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let Ok(mut seen) = seen.lock() else { return };
        match event {
            watcher::Event::Apply(vmi) | watcher::Event::InitApply(vmi) => {
                if let Some(vm) = vm_name_of(vmi.metadata.labels.as_ref()) {
                    relisted.insert(vm.clone());
                    let mut now = vmi_seen(&vmi);
                    let earlier = seen.vmis.get(&vm).and_then(|v| v.running_seen);
                    now.running_seen =
                        earlier.or_else(|| (now.phase == "Running").then(Instant::now));
                    seen.vmis.insert(vm, now);
                }
            }
            watcher::Event::Delete(vmi) => {
                if let Some(vm) = vm_name_of(vmi.metadata.labels.as_ref()) {
                    seen.vmis.remove(&vm);
                }
            }
            watcher::Event::Init => relisted.clear(),
            watcher::Event::InitDone => seen.vmis.retain(|vm, _| relisted.contains(vm)),
        }
    }
}

async fn track_pods(client: kube::Client, seen: Arc<Mutex<Seen>>) {
    let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let config = watcher::Config::default().labels(VM_LABEL);
    let mut stream = watcher(api, config).boxed();
    let mut relisted: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let now = Instant::now();
        let Ok(mut seen) = seen.lock() else { return };
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                if let Some(vm) = vm_name_of(Some(&labels)) {
                    for (k, v) in &labels {
                        seen.label_arrivals
                            .entry((vm.clone(), k.clone(), v.clone()))
                            .or_insert(now);
                    }
                    relisted.insert(vm.clone());
                    seen.pods.insert(vm);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(vm) = vm_name_of(pod.metadata.labels.as_ref()) {
                    seen.pods.remove(&vm);
                }
            }
            watcher::Event::Init => relisted.clear(),
            watcher::Event::InitDone => seen.pods.retain(|vm| relisted.contains(vm)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counters_are_summed_over_groups_and_codes() {
        let text = "\
# TYPE apiserver_request counter
apiserver_request_total{verb=\"PATCH\",group=\"\",resource=\"pods\",subresource=\"status\",code=\"200\"} 3
apiserver_request_total{verb=\"PATCH\",group=\"\",resource=\"pods\",subresource=\"status\",code=\"409\"} 1
apiserver_request_total{verb=\"POST\",group=\"kubevirt.io\",resource=\"virtualmachines\",subresource=\"\",code=\"201\"} 5
apiserver_request_total{verb=\"POST\",group=\"kubevirt.io\",resource=\"virtualmachineinstances\",subresource=\"\",code=\"201\"} 5
apiserver_request_total{verb=\"GET\",group=\"\",resource=\"pods\",subresource=\"\",code=\"200\"} 9
";
        let counts = RequestCounts::parse(text);
        assert_eq!(counts.count("PATCH", "pods"), 4);
        assert_eq!(counts.control_plane_writes(), 9);
        let before = RequestCounts::parse(
            "apiserver_request_total{verb=\"PATCH\",group=\"\",resource=\"pods\",subresource=\"status\",code=\"200\"} 1",
        );
        assert_eq!(counts.since(&before).count("PATCH", "pods"), 3);
    }
}
