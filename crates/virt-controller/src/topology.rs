//! TSC frequency placement (upstream's `watch/topology`): a guest that needs a fixed TSC
//! frequency runs, and migrates, only on nodes that can give it that frequency.
//!
//! - **Who needs it** ([`tsc_requirement`]): a guest with the CPU feature `invtsc` (policy
//!   `require` or `force`) cannot boot without it; one with Hyper-V reenlightenment cannot
//!   migrate without it.
//! - **Hints**: before such a VMI gets its launcher pod, the VMI controller writes
//!   `status.topologyHints.tscFrequency`: the configured `minimumClusterTSCFrequency`, else
//!   the lowest frequency of the nodes that report one (virt-handler's
//!   `cpu-timer.node.kubevirt.io/tsc-frequency`) and are schedulable or run VMIs
//!   ([`lowest_cluster_frequency`]). Pod creation waits for the hints ([`awaits_hints`]).
//! - **Selector**: a VMI with a frequency in its hints needs the node label
//!   `scheduling.node.kubevirt.io/tsc-frequency-<hz>` ([`scheduling_label`]); the migration
//!   target pod is rendered from the same template, so it needs the same label.
//! - **Node labels** ([`run_node_topology_updater`]): every 30 s (plus jitter) each node that
//!   reports a frequency is labelled with the frequencies in use by VMIs and the cluster's
//!   lowest that it can run: its own within QEMU's tolerance of 250 ppm, or any lower one when
//!   its TSC is scalable (`cpu-timer.node.kubevirt.io/tsc-scalable`) ([`label_diff`]).
//!
//! The launcher then starts QEMU with that frequency (`tsc-frequency` of the CPU).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{TopologyHints, VirtualMachineInstance};
use rand::Rng;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// virt-handler's label: the node's TSC frequency in Hz.
pub const TSC_FREQUENCY_LABEL: &str = "cpu-timer.node.kubevirt.io/tsc-frequency";
/// virt-handler's label: whether the node can scale the TSC frequency of its guests.
pub const TSC_SCALABLE_LABEL: &str = "cpu-timer.node.kubevirt.io/tsc-scalable";
/// Prefix of the labels (`-<hz>`) naming the frequencies a node can give its guests.
pub const TSC_FREQUENCY_SCHEDULING_LABEL: &str = "scheduling.node.kubevirt.io/tsc-frequency";
/// QEMU's tolerance for a TSC frequency a host cannot scale to, in parts per million.
pub const TSC_TOLERANCE_PPM: i64 = 250;
/// Upstream's period of the node label updater.
pub const NODE_TOPOLOGY_UPDATE_PERIOD: Duration = Duration::from_secs(30);
/// The Warning event when the hints cannot be computed for a guest that needs them to boot
/// (upstream's spelling).
pub const FAILED_GATHERING_HINTS: &str = "FailedGatherhingClusterTopologyHints";

pub use kubevirt_api::tsc::{TscRequirement, manual_tsc_frequency, tsc_requirement};

/// Whether the VMI needs hints before its pod (upstream's `IsTscFrequencyRequired`: amd64
/// guests only).
pub fn tsc_required(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec.architecture.as_deref() == Some("amd64")
        && tsc_requirement(vmi) != TscRequirement::NotRequired
}

/// Whether the VMI's launcher pod must wait for its hints.
pub fn awaits_hints(vmi: &VirtualMachineInstance) -> bool {
    tsc_required(vmi)
        && vmi
            .status
            .as_ref()
            .is_none_or(|s| s.topology_hints.is_none())
}

/// `scheduling.node.kubevirt.io/tsc-frequency-<hz>`.
pub fn scheduling_label(frequency: i64) -> String {
    format!("{TSC_FREQUENCY_SCHEDULING_LABEL}-{frequency}")
}

/// A node's TSC frequency (0 when it reports none) and whether it can scale it.
///
/// # Errors
/// A label that is not a positive integer.
pub fn node_tsc(labels: &BTreeMap<String, String>) -> Result<(i64, bool), String> {
    let scalable = labels.get(TSC_SCALABLE_LABEL).is_some_and(|v| v == "true");
    let Some(value) = labels.get(TSC_FREQUENCY_LABEL) else {
        return Ok((0, false));
    };
    match value.parse::<i64>() {
        Ok(f) if f > 0 => Ok((f, scalable)),
        Ok(f) => Err(format!(
            "tsc frequency is invalid: expected a frequency bigger than 0, but got {f}"
        )),
        Err(e) => Err(format!("tsc frequency is not an int: {e}")),
    }
}

/// The frequencies named by a node's scheduling labels.
fn frequencies_on_node(labels: &BTreeMap<String, String>) -> BTreeSet<i64> {
    let prefix = format!("{TSC_FREQUENCY_SCHEDULING_LABEL}-");
    labels
        .keys()
        .filter_map(|k| k.strip_prefix(&prefix)?.parse().ok())
        .collect()
}

/// QEMU's tolerance around `frequency`, in Hz.
pub fn tolerance(frequency: i64) -> i64 {
    frequency * TSC_TOLERANCE_PPM / 1_000_000
}

/// The scheduling labels a node should gain and lose (upstream's `CalculateTSCLabelDiff`):
/// of the frequencies in use plus its own, a node that cannot scale takes those within the
/// tolerance of its own, one that can takes those up to its own (plus the tolerance).
pub fn label_diff(
    in_use: &BTreeSet<i64>,
    on_node: &BTreeSet<i64>,
    node_frequency: i64,
    scalable: bool,
) -> (BTreeSet<i64>, BTreeSet<i64>) {
    let tol = tolerance(node_frequency);
    let wanted: BTreeSet<i64> = in_use
        .iter()
        .copied()
        .chain([node_frequency])
        .filter(|f| {
            let close = (f - node_frequency).abs() <= tol;
            if scalable {
                *f <= node_frequency || close
            } else {
                close
            }
        })
        .collect();
    let add = wanted.difference(on_node).copied().collect();
    let remove = on_node.difference(&wanted).copied().collect();
    (add, remove)
}

/// What the cluster knows about TSC frequencies: the nodes that report one and the VMIs.
pub struct ClusterTsc<'a> {
    /// Each node's name and labels.
    pub nodes: Vec<(&'a str, &'a BTreeMap<String, String>)>,
    /// The VMIs (for the frequencies in use and the nodes that run guests).
    pub vmis: &'a [VirtualMachineInstance],
}

/// The frequency hinted to new guests (upstream's `LowestTSCFrequencyOnCluster`).
///
/// # Errors
/// A configured `minimumClusterTSCFrequency` that is not above zero.
pub fn lowest_cluster_frequency(
    configured: Option<i64>,
    cluster: &ClusterTsc<'_>,
) -> Result<i64, String> {
    if let Some(f) = configured {
        return if f > 0 {
            Ok(f)
        } else {
            Err(format!(
                "the configured minimumClusterTSCFrequency must be greater 0, but got {f}"
            ))
        };
    }
    let runs_guests = |node: &str| {
        cluster
            .vmis
            .iter()
            .any(|v| v.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    };
    Ok(cluster
        .nodes
        .iter()
        .filter(|(name, labels)| {
            labels
                .get(c::NODE_SCHEDULABLE_LABEL)
                .is_some_and(|v| v == "true")
                || runs_guests(name)
        })
        .filter_map(|(_, labels)| node_tsc(labels).ok().map(|(f, _)| f))
        .filter(|f| *f > 0)
        .min()
        .unwrap_or(0))
}

/// The hints of a guest that needs them (upstream's `TopologyHintsForVMI`); `Ok(None)` for
/// one that does not.
///
/// # Errors
/// As [`lowest_cluster_frequency`].
pub fn hints_for(
    vmi: &VirtualMachineInstance,
    configured: Option<i64>,
    cluster: &ClusterTsc<'_>,
) -> Result<Option<TopologyHints>, String> {
    if !tsc_required(vmi) {
        return Ok(None);
    }
    let frequency = lowest_cluster_frequency(configured, cluster)
        .map_err(|e| format!("failed to determine the lowest tsc frequency on the cluster: {e}"))?;
    Ok(Some(TopologyHints {
        tsc_frequency: Some(frequency),
    }))
}

/// The frequencies the VMIs' hints name.
fn frequencies_in_use(vmis: &[VirtualMachineInstance]) -> BTreeSet<i64> {
    vmis.iter()
        .filter_map(kubevirt_api::tsc::hinted_frequency)
        .collect()
}

/// The merge patch of a node's labels for the frequencies it should carry, or `None` when
/// they are right.
///
/// # Errors
/// A node whose own frequency label is unreadable.
pub fn node_label_patch(
    labels: &BTreeMap<String, String>,
    required: &BTreeSet<i64>,
) -> Result<Option<Value>, String> {
    let (frequency, scalable) = node_tsc(labels)?;
    let (add, remove) = label_diff(required, &frequencies_on_node(labels), frequency, scalable);
    if add.is_empty() && remove.is_empty() {
        return Ok(None);
    }
    let mut changes = serde_json::Map::new();
    for f in add {
        changes.insert(scheduling_label(f), json!("true"));
    }
    for f in remove {
        changes.insert(scheduling_label(f), Value::Null);
    }
    Ok(Some(json!({"metadata": {"labels": changes}})))
}

/// One pass of the node label updater; returns how many nodes it patched.
async fn update_nodes(client: &Client, configured: Option<i64>) -> Result<usize, kube::Error> {
    let nodes_api: Api<Node> = Api::all(client.clone());
    // Only nodes that report a frequency take part: usually none, and then nothing else is read.
    let nodes = nodes_api
        .list(&ListParams::default().labels(TSC_FREQUENCY_LABEL))
        .await?;
    if nodes.items.is_empty() {
        return Ok(0);
    }
    let vmis = Api::<VirtualMachineInstance>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let empty = BTreeMap::new();
    let labelled: Vec<(String, &BTreeMap<String, String>)> = nodes
        .items
        .iter()
        .map(|n| (n.name_any(), n.metadata.labels.as_ref().unwrap_or(&empty)))
        .collect();
    let cluster = ClusterTsc {
        nodes: labelled.iter().map(|(n, l)| (n.as_str(), *l)).collect(),
        vmis: &vmis,
    };
    let mut required = frequencies_in_use(&vmis);
    match lowest_cluster_frequency(configured, &cluster) {
        Ok(lowest) => {
            required.insert(lowest);
        }
        Err(e) => {
            warn!(error = %e, "skipping TSC frequency updates on all nodes");
            return Ok(0);
        }
    }
    let mut patched = 0;
    for (name, labels) in &labelled {
        match node_label_patch(labels, &required) {
            Ok(None) => {}
            Ok(Some(patch)) => {
                nodes_api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                patched += 1;
            }
            Err(e) => {
                warn!(node = %name, error = %e, "could not calculate TSC frequencies for node")
            }
        }
    }
    Ok(patched)
}

/// Keeps the nodes' TSC scheduling labels current until `cancel` (upstream's node topology
/// updater); `configured` reads `minimumClusterTSCFrequency` from the CR.
pub async fn run_node_topology_updater(
    client: Client,
    configured: impl Fn() -> Option<i64>,
    cancel: CancellationToken,
) {
    loop {
        match update_nodes(&client, configured()).await {
            Ok(0) => {}
            Ok(n) => info!(updated = n, "TSC frequency node labels updated"),
            Err(e) => warn!(error = %e, "TSC frequency node update failed"),
        }
        let jitter = rand::rng().random_range(0.0..1.2);
        let wait = NODE_TOPOLOGY_UPDATE_PERIOD.mul_f64(1.0 + jitter);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests;
