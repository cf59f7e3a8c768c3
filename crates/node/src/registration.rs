//! The Node object, as kubelet keeps it: registration, capacity, addresses, `nodeInfo`, the
//! `Ready` condition and its heartbeat. Capacity: CPUs, memory, `ephemeral-storage` (the size
//! of the filesystem of `/`) and pods.
//!
//! Data flow: [`HostFacts::read`] reads a few files of this machine once; the pure
//! [`node_status`] turns them into the status; [`run`] creates the Node when it is missing
//! (with kubelet's well-known labels), patches the status, and refreshes the `Ready`
//! condition's `lastHeartbeatTime` every [`HEARTBEAT_INTERVAL`]. Everything else on the
//! Node (labels, annotations, extended resources other components advertise) is left alone:
//! status writes are merge patches of the fields kubelet owns.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the `Ready` condition's heartbeat is refreshed (kubelet reports its status at
/// least every 5 minutes and renews a Lease every 10 s; the embedded node does the former more
/// often and has no Lease).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(40);

/// What this machine offers and is.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// Number of CPUs (`processor` entries of `/proc/cpuinfo`).
    pub cpus: usize,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Size of the filesystem of `/` in bytes (kubelet reports the one of its root
    /// directory as `ephemeral-storage`), when `statvfs` answers.
    pub ephemeral_storage_bytes: Option<u64>,
    /// Resources reported instead of what the host has (see [`crate::NodeConfig`]).
    pub capacity_overrides: BTreeMap<String, String>,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl HostFacts {
    /// Reads the facts of this machine.
    pub fn read() -> Self {
        let cpus = read_trimmed("/proc/cpuinfo")
            .lines()
            .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
            .count();
        let os_image = read_trimmed("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_else(|| "Linux".to_owned());
        Self {
            cpus,
            memory_bytes: parse_mem_total(&read_trimmed("/proc/meminfo")).unwrap_or(0),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            os_image,
            machine_id: read_trimmed("/etc/machine-id"),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            ephemeral_storage_bytes: nix::sys::statvfs::statvfs("/")
                .ok()
                .and_then(|fs| fs.blocks().checked_mul(fs.fragment_size())),
            capacity_overrides: BTreeMap::new(),
        }
    }
}

/// Capacity (= allocatable) kubelet reports: CPUs, memory, ephemeral storage (when known)
/// and pods, then the overrides.
pub fn node_capacity(facts: &HostFacts) -> BTreeMap<String, String> {
    let mut capacity = BTreeMap::from([
        ("cpu".to_owned(), facts.cpus.max(1).to_string()),
        (
            "memory".to_owned(),
            format!("{}Ki", facts.memory_bytes / 1024),
        ),
        ("pods".to_owned(), "110".to_owned()),
    ]);
    if let Some(bytes) = facts.ephemeral_storage_bytes {
        capacity.insert(
            "ephemeral-storage".to_owned(),
            format!("{}Ki", bytes / 1024),
        );
    }
    capacity.extend(facts.capacity_overrides.clone());
    capacity
}

/// The pod addresses of `cidr` (`a.b.c.d/p`): all but the network, broadcast and bridge
/// gateway addresses.
pub fn pod_addresses(cidr: &str) -> Option<u64> {
    let prefix: u32 = cidr.split_once('/')?.1.parse().ok().filter(|p| *p <= 30)?;
    Some((1u64 << (32 - prefix)) - 3)
}

/// The capacity overrides with `pods` at most what the pod CIDR has addresses for.
///
/// kubelet reports `maxPods` whatever the CIDR holds, and the pods past its addresses then
/// fail their sandbox one after the other ("no IP addresses available") while the scheduler
/// keeps binding more. Reporting no more pods than addresses makes those pods `Pending` with
/// kube-scheduler's `Too many pods` instead, which says what is wrong.
pub fn pods_within_cidr(
    mut overrides: BTreeMap<String, String>,
    pod_cidr: Option<&str>,
) -> BTreeMap<String, String> {
    let Some(addresses) = pod_cidr.and_then(pod_addresses) else {
        return overrides;
    };
    let asked = overrides
        .get("pods")
        .map_or("110", String::as_str)
        .to_owned();
    let asked_count = k8s_quantity::Quantity::parse(&asked)
        .ok()
        .and_then(|q| u64::try_from(q.value()).ok());
    if asked_count.is_some_and(|n| n > addresses) {
        warn!(
            pods = %asked,
            pod_cidr = pod_cidr.unwrap_or_default(),
            addresses,
            "the node's pod capacity exceeds its pod CIDR; reporting the addresses it has"
        );
        overrides.insert("pods".to_owned(), addresses.to_string());
    }
    overrides
}

/// The labels kubelet puts on the Node it registers.
pub fn node_labels(node_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), node_name.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), "amd64".to_owned()),
    ])
}

/// The Node spec the node agent owns: its pod CIDR (`spec.podCIDR`, `spec.podCIDRs`), when it
/// has a pod network.
pub fn node_spec(pod_cidr: Option<&str>) -> Value {
    match pod_cidr {
        Some(cidr) => json!({"podCIDR": cidr, "podCIDRs": [cidr]}),
        None => json!({}),
    }
}

/// The Node status kubelet posts.
pub fn node_status(
    host_ip: &str,
    node_name: &str,
    facts: &HostFacts,
    kubelet_port: Option<u16>,
    now: &str,
) -> Value {
    let capacity = node_capacity(facts);
    let mut status = json!({
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }],
        "addresses": [
            {"type": "InternalIP", "address": host_ip},
            {"type": "Hostname", "address": node_name},
        ],
        "nodeInfo": {
            "machineID": facts.machine_id,
            "systemUUID": facts.machine_id,
            "bootID": facts.boot_id,
            "kernelVersion": facts.kernel_version,
            "osImage": facts.os_image,
            "containerRuntimeVersion": concat!("kubevirt-rs://", env!("CARGO_PKG_VERSION")),
            "kubeletVersion": concat!("v1.33.0-kubevirt-rs-", env!("CARGO_PKG_VERSION")),
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    });
    if let Some(port) = kubelet_port {
        status["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": port}});
    }
    status
}

/// Errors of node registration.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// Reading the Node failed.
    #[error("reading node {0}")]
    Get(String, #[source] kube::Error),
    /// Creating the Node failed.
    #[error("creating node {0}")]
    Create(String, #[source] kube::Error),
    /// Patching the Node's status failed.
    #[error("patching the status of node {0}")]
    Patch(String, #[source] kube::Error),
}

/// Creates the Node when missing, then writes the status kubelet owns.
///
/// # Errors
/// [`RegistrationError`] when an API call fails.
pub async fn register(
    api: &Api<Node>,
    node_name: &str,
    host_ip: &str,
    pod_cidr: Option<&str>,
    kubelet_port: Option<u16>,
    facts: &HostFacts,
) -> Result<(), RegistrationError> {
    let name = node_name.to_owned();
    let existing = api
        .get_opt(node_name)
        .await
        .map_err(|e| RegistrationError::Get(name.clone(), e))?;
    if existing.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node_name, "labels": node_labels(node_name)},
            "spec": node_spec(pod_cidr),
        }))
        .map_err(|e| RegistrationError::Create(name.clone(), kube::Error::SerdeError(e)))?;
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => info!(node = node_name, "registered the node"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(RegistrationError::Create(name, e)),
        }
    } else if let Some(cidr) = pod_cidr
        && existing
            .and_then(|n| n.spec)
            .and_then(|s| s.pod_cidr)
            .as_deref()
            != Some(cidr)
    {
        api.patch(
            node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": node_spec(pod_cidr)})),
        )
        .await
        .map_err(|e| RegistrationError::Patch(name.clone(), e))?;
        info!(node = node_name, pod_cidr = cidr, "set the node's pod CIDR");
    }
    let status = node_status(
        host_ip,
        node_name,
        facts,
        kubelet_port,
        &crate::now_rfc3339(),
    );
    api.patch_status(
        node_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .map_err(|e| RegistrationError::Patch(name, e))?;
    Ok(())
}

/// Refreshes the `Ready` condition's heartbeat time.
async fn heartbeat(api: &Api<Node>, node_name: &str) -> Result<(), RegistrationError> {
    let now = crate::now_rfc3339();
    let name = node_name.to_owned();
    // The Node itself, as kubelet reads it: `nodes/status` is only patched (kube's
    // `system:node` role has no `get` on it).
    let node = api
        .get(node_name)
        .await
        .map_err(|e| RegistrationError::Get(name.clone(), e))?;
    let mut conditions = node
        .status
        .and_then(|s| s.conditions)
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    if let Some(list) = conditions.as_array_mut() {
        for c in list.iter_mut().filter(|c| c["type"] == "Ready") {
            c["lastHeartbeatTime"] = json!(now);
        }
        api.patch_status(
            node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": list}})),
        )
        .await
        .map_err(|e| RegistrationError::Patch(name, e))?;
    }
    Ok(())
}

/// Registers the node (retrying every 5 s until it succeeds), then refreshes the heartbeat
/// every [`HEARTBEAT_INTERVAL`] until `cancel` fires.
pub async fn run(
    client: kube::Client,
    node_name: String,
    host_ip: String,
    pod_cidr: Option<String>,
    kubelet_port: Option<u16>,
    capacity_overrides: BTreeMap<String, String>,
    cancel: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let facts = HostFacts {
        capacity_overrides: pods_within_cidr(capacity_overrides, pod_cidr.as_deref()),
        ..HostFacts::read()
    };
    loop {
        match register(
            &api,
            &node_name,
            &host_ip,
            pod_cidr.as_deref(),
            kubelet_port,
            &facts,
        )
        .await
        {
            Ok(()) => break,
            Err(e) => warn!(error = %e, "node registration failed; retrying"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(HEARTBEAT_INTERVAL) => {}
        }
        if let Err(e) = heartbeat(&api, &node_name).await {
            warn!(error = %crate::pods::error_chain(&e), "node heartbeat failed; retrying on the next tick");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ephemeral_storage_is_reported_when_known() {
        let mut facts = HostFacts {
            cpus: 1,
            ..HostFacts::default()
        };
        assert!(!node_capacity(&facts).contains_key("ephemeral-storage"));
        facts.ephemeral_storage_bytes = Some(10 << 30);
        assert_eq!(
            node_capacity(&facts)["ephemeral-storage"],
            format!("{}Ki", 10 << 20)
        );
        assert!(
            HostFacts::read()
                .ephemeral_storage_bytes
                .is_some_and(|b| b > 0)
        );
    }

    #[test]
    fn overrides_replace_what_the_host_has() {
        let facts = HostFacts {
            cpus: 2,
            memory_bytes: 1 << 30,
            capacity_overrides: BTreeMap::from([
                ("cpu".to_owned(), "1k".to_owned()),
                ("pods".to_owned(), "10k".to_owned()),
            ]),
            ..HostFacts::default()
        };
        let capacity = node_capacity(&facts);
        assert_eq!(capacity["cpu"], "1k");
        assert_eq!(capacity["pods"], "10k");
        assert_eq!(
            capacity["memory"],
            format!("{}Ki", 1 << 20),
            "not overridden: the host's"
        );
    }

    #[test]
    fn pods_beyond_the_pod_cidr_are_not_reported() {
        let asked = |pods: Option<&str>| {
            pods.map(|p| BTreeMap::from([("pods".to_owned(), p.to_owned())]))
                .unwrap_or_default()
        };
        assert_eq!(pod_addresses("10.245.3.0/24"), Some(253));
        assert_eq!(pod_addresses("10.0.0.0/16"), Some(65_533));
        assert_eq!(pod_addresses("10.0.0.0/32"), None);
        // More than a /24 holds: the addresses it has.
        assert_eq!(
            pods_within_cidr(asked(Some("10k")), Some("10.245.3.0/24"))["pods"],
            "253"
        );
        // Within it, or without a pod network (host-network pods need no address): as asked.
        assert_eq!(
            pods_within_cidr(asked(Some("200")), Some("10.245.3.0/24"))["pods"],
            "200"
        );
        assert_eq!(pods_within_cidr(asked(Some("10k")), None)["pods"], "10k");
        // kubelet's default 110 fits a /24 and stays the default; a /26 does not hold it.
        assert!(pods_within_cidr(asked(None), Some("10.245.3.0/24")).is_empty());
        assert_eq!(
            pods_within_cidr(asked(None), Some("10.245.3.0/26"))["pods"],
            "61"
        );
    }

    #[test]
    fn status_is_ready_with_kubelets_reason_capacity_and_endpoint() {
        let facts = HostFacts {
            cpus: 2,
            memory_bytes: 24 << 30,
            ..HostFacts::default()
        };
        let status = node_status(
            "10.0.0.5",
            "node01",
            &facts,
            Some(10250),
            "2026-01-01T00:00:00Z",
        );
        assert_eq!(status["conditions"][0]["reason"], "KubeletReady");
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["addresses"][0]["address"], "10.0.0.5");
        assert_eq!(status["capacity"]["cpu"], "2");
        assert_eq!(status["capacity"]["memory"], format!("{}Ki", 24 << 20));
        assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
    }

    #[test]
    fn the_spec_carries_the_pod_cidr_only_with_a_pod_network() {
        assert_eq!(
            node_spec(Some("10.244.0.0/24")),
            json!({"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]})
        );
        assert_eq!(node_spec(None), json!({}));
    }

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        assert_eq!(
            parse_mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24_576_000 * 1024)
        );
    }
}
