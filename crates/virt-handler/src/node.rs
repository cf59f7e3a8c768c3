//! The Node object of this machine: registration, CPU labels and the heartbeat.
//!
//! Data flow: [`HostFacts::read`] gathers `/proc/cpuinfo`, `/proc/meminfo` and a few other
//! files once; the pure [`node_labels`] and [`device_capacity`] turn them into what the Node
//! shows; [`run_node_agent`] waits for the Node (its kubelet registers it), patches the labels
//! onto it and advertises the device resources guests need (`devices.kubevirt.io/kvm`,
//! `…/tun`) in its capacity, then refreshes the `kubevirt.io/heartbeat` annotation
//! (RFC 3339) and the schedulable label. The Node's `Ready` condition, addresses and base
//! capacity are kubelet's, never the handler's.
//!
//! Upstream advertises the device resources through kubelet's device-plugin API; kubelets
//! without one (the embedded node) take a status patch of these keys alone instead, which is
//! what the handler sends.
//!
//! CPU labels (upstream derives them from libvirt's host capabilities; without libvirt they
//! come from `/proc/cpuinfo`):
//! - `cpu-feature.node.kubevirt.io/<feature>=true` for the flags in [`FEATURE_LABELS`]
//!   that the CPU has, with libvirt's spelling (`sse4_2` → `sse4.2`);
//! - `cpu-model.node.kubevirt.io/<model>=true` for each QEMU model in [`CPU_MODELS`] whose
//!   required flags are all present, and `host-model-cpu.node.kubevirt.io/<model>=true` for
//!   the newest of them — an approximation of libvirt's host-model expansion;
//! - `cpu-timer.node.kubevirt.io/tsc-frequency` and `kubevirt.io/tsc-frequency` (Hz) when
//!   the TSC is invariant (`constant_tsc` and `nonstop_tsc`) and its frequency is known.
//!
//! # Caveats
//! The heartbeat only says the handler process lives. Upstream's node controller in
//! virt-controller marks a node with a stale heartbeat unschedulable and fails its VMIs; that
//! controller does not exist here yet, so a stale heartbeat changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kubevirt_api::constants::{HEARTBEAT_ANNOTATION, NODE_SCHEDULABLE_LABEL};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::warn;

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
/// Label prefix of CPU features.
pub const CPU_FEATURE_PREFIX: &str = "cpu-feature.node.kubevirt.io/";
/// Label prefix of usable CPU models.
pub const CPU_MODEL_PREFIX: &str = "cpu-model.node.kubevirt.io/";
/// Label prefix of the host CPU model.
pub const HOST_MODEL_PREFIX: &str = "host-model-cpu.node.kubevirt.io/";
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

/// `/proc/cpuinfo` flags that become feature labels: cpuinfo name → libvirt name.
pub const FEATURE_LABELS: &[(&str, &str)] = &[
    ("adx", "adx"),
    ("aes", "aes"),
    ("avx", "avx"),
    ("avx2", "avx2"),
    ("avx512bw", "avx512bw"),
    ("avx512cd", "avx512cd"),
    ("avx512dq", "avx512dq"),
    ("avx512f", "avx512f"),
    ("avx512vl", "avx512vl"),
    ("bmi1", "bmi1"),
    ("bmi2", "bmi2"),
    ("erms", "erms"),
    ("f16c", "f16c"),
    ("fma", "fma"),
    ("fsgsbase", "fsgsbase"),
    ("hypervisor", "hypervisor"),
    ("invpcid", "invpcid"),
    ("movbe", "movbe"),
    ("pcid", "pcid"),
    ("pclmulqdq", "pclmuldq"),
    ("pdpe1gb", "pdpe1gb"),
    ("popcnt", "popcnt"),
    ("rdrand", "rdrand"),
    ("rdseed", "rdseed"),
    ("rdtscp", "rdtscp"),
    ("sha_ni", "sha-ni"),
    ("smap", "smap"),
    ("smep", "smep"),
    ("sse4_1", "sse4.1"),
    ("sse4_2", "sse4.2"),
    ("ssse3", "ssse3"),
    ("svm", "svm"),
    ("vmx", "vmx"),
    ("x2apic", "x2apic"),
    ("xsave", "xsave"),
    ("xsaveopt", "xsaveopt"),
];

/// QEMU CPU models, oldest first, with the cpuinfo flags each needs beyond its predecessor.
pub const CPU_MODELS: &[(&str, &[&str])] = &[
    ("qemu64", &[]),
    ("Nehalem", &["sse4_1", "sse4_2", "popcnt", "ssse3"]),
    ("Westmere", &["aes", "pclmulqdq"]),
    ("SandyBridge", &["avx", "xsave", "tsc_deadline_timer"]),
    ("IvyBridge", &["f16c", "rdrand", "fsgsbase", "smep", "erms"]),
    (
        "Haswell-noTSX",
        &["avx2", "bmi1", "bmi2", "fma", "movbe", "invpcid"],
    ),
    (
        "Broadwell-noTSX",
        &["adx", "rdseed", "smap", "3dnowprefetch"],
    ),
    (
        "Skylake-Client-noTSX-IBRS",
        &["xsavec", "xgetbv1", "clflushopt"],
    ),
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
            tun: std::path::Path::new("/dev/net/tun").exists(),
            cpu,
        }
    }
}

/// The labels virt-handler owns on its Node.
pub fn node_labels(node_name: &str, facts: &HostFacts) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut set = |k: String, v: &str| {
        labels.insert(k, v.to_owned());
    };
    set(NODE_SCHEDULABLE_LABEL.to_owned(), "true");
    set("kubernetes.io/hostname".to_owned(), node_name);
    set("kubernetes.io/os".to_owned(), "linux");
    set("kubernetes.io/arch".to_owned(), "amd64");
    let flags = &facts.cpu.flags;
    for (cpuinfo_name, label_name) in FEATURE_LABELS {
        if flags.contains(*cpuinfo_name) {
            set(format!("{CPU_FEATURE_PREFIX}{label_name}"), "true");
        }
    }
    let mut newest = None;
    for (model, needs) in CPU_MODELS {
        if !needs.iter().all(|f| flags.contains(*f)) {
            break;
        }
        set(format!("{CPU_MODEL_PREFIX}{model}"), "true");
        newest = Some(*model);
    }
    if let Some(model) = newest {
        set(format!("{HOST_MODEL_PREFIX}{model}"), "true");
    }
    let invariant = flags.contains("constant_tsc") && flags.contains("nonstop_tsc");
    if let (true, Some(hz)) = (invariant, facts.tsc_hz) {
        set(TSC_FREQUENCY_LABEL.to_owned(), &hz.to_string());
        set(TSC_FREQUENCY_SHORT_LABEL.to_owned(), &hz.to_string());
        set(TSC_SCALABLE_LABEL.to_owned(), "false");
    }
    labels
}

/// The device resources this node offers guests (capacity = allocatable).
pub fn device_capacity(facts: &HostFacts) -> BTreeMap<String, String> {
    let mut capacity = BTreeMap::new();
    if facts.kvm_usable {
        capacity.insert(KVM_RESOURCE.to_owned(), "1k".to_owned());
    }
    if facts.tun {
        capacity.insert(TUN_RESOURCE.to_owned(), "1k".to_owned());
    }
    capacity
}

/// Errors of node registration.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Reading the Node failed.
    #[error("reading node {0}")]
    Get(String, #[source] kube::Error),
    /// Creating the Node failed.
    #[error("creating node {0}")]
    Create(String, #[source] kube::Error),
    /// Patching the Node failed.
    #[error("patching node {0}")]
    Patch(String, #[source] kube::Error),
    /// The node is not registered (yet): its kubelet creates it.
    #[error("node {0} does not exist (yet)")]
    Missing(String),
}

/// Patches the handler's labels, the heartbeat and the device resources onto the Node.
///
/// # Errors
/// [`NodeError::Missing`] while the Node is not registered yet; [`NodeError`] when an API
/// call fails.
pub async fn register_node(
    api: &Api<Node>,
    node_name: &str,
    facts: &HostFacts,
) -> Result<(), NodeError> {
    let now = crate::now_rfc3339();
    let labels = node_labels(node_name, facts);
    let name = node_name.to_owned();
    if api
        .get_opt(node_name)
        .await
        .map_err(|e| NodeError::Get(name.clone(), e))?
        .is_none()
    {
        return Err(NodeError::Missing(name));
    }
    let patch = json!({"metadata": {"labels": labels, "annotations": {HEARTBEAT_ANNOTATION: now}}});
    api.patch(node_name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|e| NodeError::Patch(name.clone(), e))?;
    let devices = device_capacity(facts);
    if !devices.is_empty() {
        api.patch_status(
            node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": devices, "allocatable": devices}})),
        )
        .await
        .map_err(|e| NodeError::Patch(name, e))?;
    }
    Ok(())
}

/// Refreshes the heartbeat annotation and the schedulable label.
async fn heartbeat(api: &Api<Node>, node_name: &str) -> Result<(), NodeError> {
    let now = crate::now_rfc3339();
    let patch = json!({"metadata": {
        "labels": {NODE_SCHEDULABLE_LABEL: "true"},
        "annotations": {HEARTBEAT_ANNOTATION: now},
    }});
    api.patch(node_name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|e| NodeError::Patch(node_name.to_owned(), e))?;
    Ok(())
}

/// Registers the node, then refreshes the heartbeat after each [`jittered`] wait of
/// [`HEARTBEAT_INTERVAL`] (counted from the end of the previous heartbeat) until
/// `cancel` fires. Failures are logged and retried on the next tick (registration
/// until it succeeds, every second while the Node is not registered yet).
pub async fn run_node_agent(client: kube::Client, node_name: String, cancel: CancellationToken) {
    let api: Api<Node> = Api::all(client);
    let facts = HostFacts::read();
    loop {
        match register_node(&api, &node_name, &facts).await {
            Ok(()) => break,
            Err(e) => warn!(error = %e, "node registration failed; retrying"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    loop {
        let wait = jittered(
            HEARTBEAT_INTERVAL,
            HEARTBEAT_JITTER_FACTOR,
            random_fraction(),
        );
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if let Err(e) = heartbeat(&api, &node_name).await {
            warn!(error = %e, "node heartbeat failed; retrying on the next tick");
        }
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
    fn cpuinfo_gives_model_vendor_flags_and_processor_count() {
        let cpu = parse_cpuinfo(CPUINFO);
        assert_eq!(cpu.processors, 2);
        assert_eq!(cpu.vendor, "GenuineIntel");
        assert!(cpu.model_name.ends_with("@ 2.90GHz"));
        assert!(cpu.flags.contains("avx2") && cpu.flags.contains("sha_ni"));
    }

    #[test]
    fn labels_name_features_models_host_model_and_tsc() {
        let labels = node_labels("node01", &facts());
        let has = |k: &str| labels.get(k).map(String::as_str);
        assert_eq!(has("kubevirt.io/schedulable"), Some("true"));
        assert_eq!(has("kubernetes.io/hostname"), Some("node01"));
        assert_eq!(has("cpu-feature.node.kubevirt.io/sse4.2"), Some("true"));
        assert_eq!(has("cpu-feature.node.kubevirt.io/sha-ni"), Some("true"));
        assert_eq!(has("cpu-feature.node.kubevirt.io/vmx"), None);
        assert_eq!(
            has("cpu-model.node.kubevirt.io/Haswell-noTSX"),
            Some("true")
        );
        assert_eq!(has("cpu-model.node.kubevirt.io/Broadwell-noTSX"), None);
        assert_eq!(
            has("host-model-cpu.node.kubevirt.io/Haswell-noTSX"),
            Some("true")
        );
        assert_eq!(has(TSC_FREQUENCY_LABEL), Some("2900000000"));
        assert_eq!(has(TSC_FREQUENCY_SHORT_LABEL), Some("2900000000"));
    }

    #[test]
    fn a_tsc_that_is_not_invariant_gets_no_frequency_label() {
        let mut f = facts();
        f.cpu.flags.remove("nonstop_tsc");
        assert!(!node_labels("n", &f).contains_key(TSC_FREQUENCY_LABEL));
    }

    #[test]
    fn kvm_capacity_is_offered_only_when_kvm_is_usable() {
        let mut f = facts();
        f.tun = true;
        let capacity = device_capacity(&f);
        assert_eq!(capacity[TUN_RESOURCE], "1k");
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
