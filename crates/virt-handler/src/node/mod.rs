//! The Node object of this machine: labels, device resources and the heartbeat.
//!
//! Data flow: [`HostFacts::read`] gathers `/proc/cpuinfo`, `/proc/meminfo` and the device
//! files once, and [`probe::probe_qemu`] asks QEMU once per handler start what CPU models,
//! features and machine types it can run here; the pure [`cpu::cpu_labels`],
//! [`node_labels`], [`labels_patch`] and [`device_capacity`] turn them into what the Node
//! shows. [`run_node_agent`] waits for the Node (its kubelet registers it), replaces the
//! labels the handler owns ([`OWNED_LABEL_PREFIXES`]: stale ones are removed, others'
//! labels kept) with a JSON Patch that tests the labels it read, advertises the device
//! resources guests need (`devices.kubevirt.io/kvm`, `…/tun`, `…/vhost-net`) in its
//! capacity, then on each jittered tick re-syncs the labels and refreshes the
//! `kubevirt.io/heartbeat` annotation (RFC 3339) and the schedulable label. The Node's
//! `Ready` condition, addresses and base capacity are kubelet's, never the handler's.
//!
//! Upstream advertises the device resources through kubelet's device-plugin API; kubelets
//! without one (the embedded node) take a status patch of these keys alone instead, which is
//! what the handler sends.
//!
//! Labels besides the CPU ones ([`cpu`]): `cpu-timer.node.kubevirt.io/tsc-frequency` and
//! `kubevirt.io/tsc-frequency` (Hz) when the TSC is invariant (`constant_tsc` and
//! `nonstop_tsc`) and its frequency is known. Upstream's labeller runs every 3 minutes; here
//! the labels are re-synced with each heartbeat and when the KubeVirt CR's
//! `obsoleteCPUModels` change.
//!
//! When the handler stops (`cancel`), it sets `kubevirt.io/schedulable=false` on its Node, as
//! upstream, retrying with back-off for a few seconds; its next start sets it back to `true`.
//! virt-controller's node controller (`virt_controller::node`) does the same for a node whose
//! heartbeat went stale, and fails the VMIs left there without a live launcher.
//!
//! # Caveats
//! The heartbeat only says the handler process lives. The interval is upstream's minute
//! unless `--heartbeat-interval` sets another (tests). A Node with
//! `node-labeller.kubevirt.io/skip-node` keeps its labels, as upstream.

pub mod cpu;
pub mod probe;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kubevirt_api::cluster_config::ClusterConfigWatch;
use kubevirt_api::constants::{HEARTBEAT_ANNOTATION, NODE_SCHEDULABLE_LABEL};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The heartbeat period; each wait adds a random jitter of up to
/// [`HEARTBEAT_JITTER_FACTOR`] times it, as upstream's `wait.JitterUntil(…, 1.2, sliding)`.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);

/// Upstream's heartbeat jitter factor.
pub const HEARTBEAT_JITTER_FACTOR: f64 = 1.2;

/// The wait before the next heartbeat: `period + fraction × factor × period`, where
/// `fraction` is a random number in `[0, 1)` (clamped into it), as apimachinery's
/// `wait.Jitter`.
pub fn jittered(period: Duration, factor: f64, fraction: f64) -> Duration {
    let fraction = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    period + period.mul_f64(fraction * factor.max(0.0))
}

/// A random number in `[0, 1)` from the standard library's per-process random hasher keys
/// (jitter needs no stronger source, nor a dependency).
fn random_fraction() -> f64 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let bits = std::collections::hash_map::RandomState::new().hash_one(nanos);
    // The top 53 bits fill an f64 mantissa exactly.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
/// Upstream's TSC frequency label.
pub const TSC_FREQUENCY_LABEL: &str = "cpu-timer.node.kubevirt.io/tsc-frequency";
/// The TSC frequency label named in this project's issue.
pub const TSC_FREQUENCY_SHORT_LABEL: &str = "kubevirt.io/tsc-frequency";
/// Upstream's TSC scaling label.
pub const TSC_SCALABLE_LABEL: &str = "cpu-timer.node.kubevirt.io/tsc-scalable";
/// The extended resource granted per KVM guest.
pub const KVM_RESOURCE: &str = "devices.kubevirt.io/kvm";
/// The extended resource granted per tap-using guest.
pub const TUN_RESOURCE: &str = "devices.kubevirt.io/tun";
/// The extended resource granted per guest with a vhost-net interface.
pub const VHOST_NET_RESOURCE: &str = "devices.kubevirt.io/vhost-net";
/// A Node with this annotation keeps its labels: the handler does not touch them.
pub const SKIP_NODE_ANNOTATION: &str = "node-labeller.kubevirt.io/skip-node";

/// The label keys (by prefix) the handler owns: upstream's node-labeller prefixes and the
/// short TSC label. An owned key the handler no longer computes is removed.
pub const OWNED_LABEL_PREFIXES: &[&str] = &[
    cpu::CPU_FEATURE_PREFIX,
    cpu::CPU_MODEL_PREFIX,
    cpu::CPU_MODEL_MIGRATION_PREFIX,
    "cpu-timer.node.kubevirt.io/",
    "hyperv.node.kubevirt.io/",
    "kubevirt.io/realtime",
    "kubevirt.io/sev",
    "kubevirt.io/sev-es",
    "kubevirt.io/sev-snp",
    "kubevirt.io/tdx",
    "kubevirt.io/vm-arch-",
    cpu::HOST_MODEL_PREFIX,
    cpu::HOST_MODEL_REQUIRED_FEATURES_PREFIX,
    cpu::OBSOLETE_HOST_MODEL_LABEL,
    cpu::MACHINE_TYPE_PREFIX,
    cpu::CPU_VENDOR_PREFIX,
    TSC_FREQUENCY_SHORT_LABEL,
];

/// What `/proc/cpuinfo` says about the first CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuInfo {
    /// `model name`.
    pub model_name: String,
    /// `vendor_id`.
    pub vendor: String,
    /// `flags`.
    pub flags: BTreeSet<String>,
    /// Number of `processor` entries.
    pub processors: usize,
}

/// Parses `/proc/cpuinfo` (the first CPU's fields, and the processor count).
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "processor" => info.processors += 1,
            "model name" if info.model_name.is_empty() => value.clone_into(&mut info.model_name),
            "vendor_id" if info.vendor.is_empty() => value.clone_into(&mut info.vendor),
            "flags" if info.flags.is_empty() => {
                info.flags = value.split_whitespace().map(str::to_owned).collect();
            }
            _ => {}
        }
    }
    info
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The TSC frequency in Hz from the kernel's `tsc_freq_khz`, else from a model name such
/// as `Intel(R) Xeon(R) CPU @ 2.60GHz`.
pub fn tsc_frequency_hz(tsc_freq_khz: Option<&str>, model_name: &str) -> Option<u64> {
    if let Some(khz) = tsc_freq_khz.and_then(|k| k.trim().parse::<u64>().ok()) {
        return khz.checked_mul(1000);
    }
    let ghz = model_name.rsplit('@').next()?.trim().strip_suffix("GHz")?;
    let (whole, frac) = ghz.trim().split_once('.').unwrap_or((ghz.trim(), ""));
    let mut hz = whole.parse::<u64>().ok()?.checked_mul(1_000_000_000)?;
    let mut scale = 100_000_000;
    for digit in frac.chars().take(9) {
        hz += u64::from(digit.to_digit(10)?) * scale;
        scale /= 10;
    }
    Some(hz)
}

/// Host facts the Node is built from.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// Parsed `/proc/cpuinfo`.
    pub cpu: CpuInfo,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// TSC frequency in Hz, when known.
    pub tsc_hz: Option<u64>,
    /// Whether guests can use KVM (see `virt_launcher::accel`).
    pub kvm_usable: bool,
    /// `/dev/net/tun` exists.
    pub tun: bool,
    /// `/dev/vhost-net` exists.
    pub vhost_net: bool,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl HostFacts {
    /// Reads the facts of this machine.
    pub fn read() -> Self {
        let cpu = parse_cpuinfo(&read_trimmed("/proc/cpuinfo"));
        let tsc_khz = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/tsc_freq_khz").ok();
        let tsc_hz = tsc_frequency_hz(tsc_khz.as_deref(), &cpu.model_name);
        Self {
            memory_bytes: parse_mem_total(&read_trimmed("/proc/meminfo")).unwrap_or(0),
            tsc_hz,
            kvm_usable: virt_launcher::accel::detect_accel(virt_launcher::accel::AccelMode::Auto)
                .accel
                == virt_launcher::spec::Accel::Kvm,
            tun: Path::new("/dev/net/tun").exists(),
            vhost_net: Path::new("/dev/vhost-net").exists(),
            cpu,
        }
    }
}

/// Whether the handler owns the label `key` (see [`OWNED_LABEL_PREFIXES`]).
pub fn is_owned_label(key: &str) -> bool {
    OWNED_LABEL_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// The labels virt-handler sets on its Node: the schedulable label, kubelet-style host
/// labels, the CPU labels QEMU's answers give ([`cpu::cpu_labels`]) and the TSC labels.
pub fn node_labels(
    node_name: &str,
    facts: &HostFacts,
    cpu_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = cpu_labels.clone();
    let mut set = |k: String, v: &str| {
        labels.insert(k, v.to_owned());
    };
    set(NODE_SCHEDULABLE_LABEL.to_owned(), "true");
    set("kubernetes.io/hostname".to_owned(), node_name);
    set("kubernetes.io/os".to_owned(), "linux");
    set("kubernetes.io/arch".to_owned(), "amd64");
    let flags = &facts.cpu.flags;
    let invariant = flags.contains("constant_tsc") && flags.contains("nonstop_tsc");
    if let (true, Some(hz)) = (invariant, facts.tsc_hz) {
        set(TSC_FREQUENCY_LABEL.to_owned(), &hz.to_string());
        set(TSC_FREQUENCY_SHORT_LABEL.to_owned(), &hz.to_string());
        set(TSC_SCALABLE_LABEL.to_owned(), "false");
    }
    labels
}

/// The Node's labels after the handler's pass: every owned key it no longer computes
/// removed, `desired` set, every other key kept (upstream's `removeLabellerLabels` then
/// `addLabellerLabels`).
pub fn merged_labels(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = current
        .iter()
        .filter(|(k, _)| !is_owned_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(desired.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

/// The JSON Patch that moves the Node's labels from `current` to [`merged_labels`], with a
/// `test` of the current labels (a concurrent writer makes it fail, as upstream's); `None`
/// when nothing changes.
pub fn labels_patch(
    current: Option<&BTreeMap<String, String>>,
    desired: &BTreeMap<String, String>,
) -> Option<serde_json::Value> {
    let empty = BTreeMap::new();
    let old = current.unwrap_or(&empty);
    let new = merged_labels(old, desired);
    if &new == old {
        return None;
    }
    let mut ops = Vec::new();
    match current {
        Some(old) => {
            ops.push(json!({"op": "test", "path": "/metadata/labels", "value": old}));
            ops.push(json!({"op": "replace", "path": "/metadata/labels", "value": new}));
        }
        None => ops.push(json!({"op": "add", "path": "/metadata/labels", "value": new})),
    }
    Some(serde_json::Value::Array(ops))
}

/// The device resources this node offers guests (capacity = allocatable), as upstream's
/// device plugins: 1k of each whose device exists.
pub fn device_capacity(facts: &HostFacts) -> BTreeMap<String, String> {
    let mut capacity = BTreeMap::new();
    if facts.kvm_usable {
        capacity.insert(KVM_RESOURCE.to_owned(), "1k".to_owned());
    }
    if facts.tun {
        capacity.insert(TUN_RESOURCE.to_owned(), "1k".to_owned());
    }
    if facts.vhost_net {
        capacity.insert(VHOST_NET_RESOURCE.to_owned(), "1k".to_owned());
    }
    capacity
}

/// Errors of node registration.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Reading the Node failed.
    #[error("reading node {0}")]
    Get(String, #[source] kube::Error),
    /// Patching the Node failed.
    #[error("patching node {0}")]
    Patch(String, #[source] kube::Error),
    /// The node is not registered (yet): its kubelet creates it.
    #[error("node {0} does not exist (yet)")]
    Missing(String),
}

/// What the handler puts on its Node, computed once per start.
#[derive(Debug, Clone, Default)]
pub struct NodeAgent {
    /// This node's name.
    pub node_name: String,
    /// Host facts.
    pub facts: HostFacts,
    /// QEMU's answers (`None` when the probe failed: no CPU labels then).
    pub answers: Option<cpu::QemuCpuAnswers>,
}

impl NodeAgent {
    /// The owned labels for the obsolete models in effect.
    pub fn labels(&self, obsolete: &BTreeSet<String>) -> BTreeMap<String, String> {
        let cpu = self
            .answers
            .as_ref()
            .map(|a| cpu::cpu_labels(a, obsolete))
            .unwrap_or_default();
        node_labels(&self.node_name, &self.facts, &cpu)
    }

    /// Brings the Node's labels up to date (unless it carries [`SKIP_NODE_ANNOTATION`]).
    ///
    /// # Errors
    /// [`NodeError::Missing`] while the Node is not registered yet; [`NodeError`] when an
    /// API call fails (a concurrent label change fails the patch's `test`).
    pub async fn sync_labels(
        &self,
        api: &Api<Node>,
        obsolete: &BTreeSet<String>,
    ) -> Result<(), NodeError> {
        let name = self.node_name.clone();
        let node = api
            .get_opt(&name)
            .await
            .map_err(|e| NodeError::Get(name.clone(), e))?
            .ok_or_else(|| NodeError::Missing(name.clone()))?;
        if node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SKIP_NODE_ANNOTATION))
        {
            return Ok(());
        }
        let desired = self.labels(obsolete);
        if let Some(patch) = labels_patch(node.metadata.labels.as_ref(), &desired) {
            let patch: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| NodeError::Patch(name.clone(), kube::Error::SerdeError(e)))?;
            api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
                .map_err(|e| NodeError::Patch(name.clone(), e))?;
        }
        Ok(())
    }

    /// Labels the Node, refreshes the heartbeat and advertises the device resources.
    ///
    /// # Errors
    /// As [`NodeAgent::sync_labels`].
    pub async fn register(
        &self,
        api: &Api<Node>,
        obsolete: &BTreeSet<String>,
    ) -> Result<(), NodeError> {
        self.sync_labels(api, obsolete).await?;
        heartbeat(api, &self.node_name).await?;
        let devices = device_capacity(&self.facts);
        if !devices.is_empty() {
            api.patch_status(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"capacity": devices, "allocatable": devices}})),
            )
            .await
            .map_err(|e| NodeError::Patch(self.node_name.clone(), e))?;
        }
        Ok(())
    }
}

/// The merge patch of a heartbeat at `now`: the annotation and the schedulable label
/// (`"false"` when the handler is stopping, as upstream's last beat).
pub fn heartbeat_patch(now: &str, schedulable: bool) -> serde_json::Value {
    json!({"metadata": {
        "labels": {NODE_SCHEDULABLE_LABEL: if schedulable { "true" } else { "false" }},
        "annotations": {HEARTBEAT_ANNOTATION: now},
    }})
}

/// Refreshes the heartbeat annotation and the schedulable label.
async fn heartbeat(api: &Api<Node>, node_name: &str) -> Result<(), NodeError> {
    beat(api, node_name, true).await
}

async fn beat(api: &Api<Node>, node_name: &str, schedulable: bool) -> Result<(), NodeError> {
    let patch = heartbeat_patch(&crate::now_rfc3339(), schedulable);
    api.patch(node_name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|e| NodeError::Patch(node_name.to_owned(), e))?;
    Ok(())
}

/// How many times the last, unschedulable heartbeat is tried when the handler stops, and the
/// first wait between tries (doubled each time: about 3 s in all, as upstream's default
/// back-off).
const STOP_BEAT_TRIES: u32 = 5;
const STOP_BEAT_FIRST_WAIT: Duration = Duration::from_millis(200);

/// The handler's last heartbeat: the Node marked unschedulable, retried with back-off.
async fn mark_unschedulable_on_stop(api: &Api<Node>, node_name: &str) {
    let mut wait = STOP_BEAT_FIRST_WAIT;
    for attempt in 1..=STOP_BEAT_TRIES {
        match beat(api, node_name, false).await {
            Ok(()) => {
                info!(
                    node = node_name,
                    "virt-handler stopping: node marked unschedulable"
                );
                return;
            }
            Err(e) if attempt == STOP_BEAT_TRIES => {
                warn!(error = %ErrorChain(&e), "marking the node unschedulable on stop failed");
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
}

/// Probes QEMU once (see [`probe`]), registers the node, then after each [`jittered`] wait
/// of `interval` ([`HEARTBEAT_INTERVAL`] by default; counted from the end of the previous
/// one) re-syncs the labels and refreshes the heartbeat, until `cancel` fires; a change of the
/// obsolete models re-syncs the labels at once. Failures are logged and retried on the next
/// tick (registration until it succeeds, every second while the Node is not registered yet).
/// Once `cancel` fires after registration, the Node is marked unschedulable.
pub async fn run_node_agent(
    client: kube::Client,
    node_name: String,
    interval: Duration,
    obsolete: ClusterConfigWatch<BTreeSet<String>>,
    cancel: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let facts = HostFacts::read();
    let answers = match probe::probe_qemu(Path::new(QEMU_BINARY), facts.kvm_usable).await {
        Ok(answers) => Some(answers),
        Err(e) => {
            warn!(error = %ErrorChain(&e), "probing QEMU failed; the node gets no CPU labels");
            None
        }
    };
    let agent = NodeAgent {
        node_name,
        facts,
        answers,
    };
    let mut changes = obsolete.receiver();
    let mut watching = true;
    loop {
        match agent.register(&api, &obsolete.current()).await {
            Ok(()) => break,
            Err(e) => warn!(error = %ErrorChain(&e), "node registration failed; retrying"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    loop {
        let wait = jittered(interval, HEARTBEAT_JITTER_FACTOR, random_fraction());
        let config_changed = tokio::select! {
            () = cancel.cancelled() => {
                mark_unschedulable_on_stop(&api, &agent.node_name).await;
                return;
            }
            () = tokio::time::sleep(wait) => false,
            changed = changes.changed(), if watching => {
                // A fixed configuration (its sender gone) never changes again.
                watching = changed.is_ok();
                watching
            }
        };
        if let Err(e) = agent.sync_labels(&api, &obsolete.current()).await {
            warn!(error = %ErrorChain(&e), "node labels failed; retrying on the next tick");
        }
        if config_changed {
            continue;
        }
        if let Err(e) = heartbeat(&api, &agent.node_name).await {
            warn!(error = %ErrorChain(&e), "node heartbeat failed; retrying on the next tick");
        }
    }
}

/// The QEMU binary the handler probes (on `PATH`, as the launcher runs it).
pub const QEMU_BINARY: &str = "qemu-system-x86_64";

/// Shows an error with its sources.
struct ErrorChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_waits_one_minute_plus_up_to_one_point_two_minutes_of_jitter() {
        let p = HEARTBEAT_INTERVAL;
        let f = HEARTBEAT_JITTER_FACTOR;
        assert_eq!(jittered(p, f, 0.0), Duration::from_secs(60));
        assert_eq!(jittered(p, f, 0.5), Duration::from_secs(96));
        assert_eq!(jittered(p, f, 1.0), Duration::from_secs(132));
        assert_eq!(jittered(p, f, f64::NAN), Duration::from_secs(60));
        for _ in 0..100 {
            let r = random_fraction();
            assert!((0.0..1.0).contains(&r), "{r}");
            let wait = jittered(p, f, r);
            assert!(wait >= Duration::from_secs(60) && wait < Duration::from_secs(132));
        }
    }

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\nflags\t\t: fpu vme tsc constant_tsc nonstop_tsc ssse3 fma sse4_1 sse4_2 popcnt aes xsave avx f16c rdrand hypervisor tsc_deadline_timer pclmulqdq fsgsbase smep erms avx2 bmi1 bmi2 movbe invpcid sha_ni\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\nflags\t\t: fpu\n";

    fn facts() -> HostFacts {
        let cpu = parse_cpuinfo(CPUINFO);
        HostFacts {
            tsc_hz: tsc_frequency_hz(None, &cpu.model_name),
            cpu,
            memory_bytes: 24 << 30,
            ..HostFacts::default()
        }
    }

    #[test]
    fn a_stopping_handler_beats_once_more_with_the_node_unschedulable() {
        let now = "2026-12-03T10:00:00Z";
        assert_eq!(
            heartbeat_patch(now, false),
            json!({"metadata": {
                "labels": {"kubevirt.io/schedulable": "false"},
                "annotations": {"kubevirt.io/heartbeat": now},
            }})
        );
        assert_eq!(
            heartbeat_patch(now, true)["metadata"]["labels"]["kubevirt.io/schedulable"],
            "true"
        );
    }

    #[test]
    fn cpuinfo_gives_model_vendor_flags_and_processor_count() {
        let cpu = parse_cpuinfo(CPUINFO);
        assert_eq!(cpu.processors, 2);
        assert_eq!(cpu.vendor, "GenuineIntel");
        assert!(cpu.model_name.ends_with("@ 2.90GHz"));
        assert!(cpu.flags.contains("avx2") && cpu.flags.contains("sha_ni"));
    }

    fn cpu(pairs: &[&str]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|k| ((*k).to_owned(), "true".to_owned()))
            .collect()
    }

    #[test]
    fn labels_add_host_labels_and_tsc_to_the_cpu_labels() {
        let labels = node_labels(
            "node01",
            &facts(),
            &cpu(&["cpu-model.node.kubevirt.io/Westmere"]),
        );
        let has = |k: &str| labels.get(k).map(String::as_str);
        assert_eq!(has("kubevirt.io/schedulable"), Some("true"));
        assert_eq!(has("kubernetes.io/hostname"), Some("node01"));
        assert_eq!(has("cpu-model.node.kubevirt.io/Westmere"), Some("true"));
        assert_eq!(has(TSC_FREQUENCY_LABEL), Some("2900000000"));
        assert_eq!(has(TSC_FREQUENCY_SHORT_LABEL), Some("2900000000"));
        assert_eq!(has(TSC_SCALABLE_LABEL), Some("false"));
    }

    #[test]
    fn a_tsc_that_is_not_invariant_gets_no_frequency_label() {
        let mut f = facts();
        f.cpu.flags.remove("nonstop_tsc");
        assert!(!node_labels("n", &f, &BTreeMap::new()).contains_key(TSC_FREQUENCY_LABEL));
    }

    #[test]
    fn stale_owned_labels_are_removed_and_foreign_ones_kept() {
        let current: BTreeMap<String, String> = [
            ("cpu-model.node.kubevirt.io/qemu64", "true"),
            ("cpu-feature.node.kubevirt.io/avx", "true"),
            ("machine-type.node.kubevirt.io/pc-q35-2.4", "true"),
            ("cpu-timer.node.kubevirt.io/tsc-frequency", "1"),
            ("kubevirt.io/schedulable", "true"),
            ("team", "blue"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let desired = cpu(&[
            "cpu-model.node.kubevirt.io/Westmere",
            "kubevirt.io/schedulable",
        ]);
        let patch = labels_patch(Some(&current), &desired).expect("a change");
        assert_eq!(patch[0]["op"], "test");
        assert_eq!(patch[0]["value"], json!(current));
        assert_eq!(patch[1]["op"], "replace");
        assert_eq!(
            patch[1]["value"],
            json!({
                "cpu-model.node.kubevirt.io/Westmere": "true",
                "kubevirt.io/schedulable": "true",
                "team": "blue",
            })
        );
        let merged = merged_labels(&current, &desired);
        assert_eq!(labels_patch(Some(&merged), &desired), None);
        let fresh = labels_patch(None, &desired).expect("labels added");
        assert_eq!(fresh[0]["op"], "add");
    }

    #[test]
    fn kvm_capacity_is_offered_only_when_kvm_is_usable() {
        let mut f = facts();
        f.tun = true;
        f.vhost_net = true;
        let capacity = device_capacity(&f);
        assert_eq!(capacity[TUN_RESOURCE], "1k");
        assert_eq!(capacity[VHOST_NET_RESOURCE], "1k");
        assert!(!capacity.contains_key(KVM_RESOURCE));
        assert!(!capacity.contains_key("cpu"), "base capacity is kubelet's");
        f.kvm_usable = true;
        assert_eq!(device_capacity(&f)[KVM_RESOURCE], "1k");
    }

    #[test]
    fn meminfo_and_tsc_parsers_handle_their_formats() {
        assert_eq!(
            parse_mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(tsc_frequency_hz(Some("2600000\n"), ""), Some(2_600_000_000));
        assert_eq!(tsc_frequency_hz(None, "AMD EPYC 7B13"), None);
    }
}
