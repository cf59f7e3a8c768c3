//! The VMI families virt-controller serves, computed from the VMI cache at each scrape:
//!
//! - `kubevirt_vmi_info` (upstream's, value 1 per VMI) with upstream's labels: `node`,
//!   `namespace`, `name`, `phase` (lower case), `os`/`workload`/`flavor` (the
//!   `vm.kubevirt.io/*` annotations, `<none>` without), `instance_type`, `preference`, the
//!   `guest_os_*` fields of `status.guestOSInfo` and `status.machine`, `evictable`,
//!   `outdated` (the `kubevirt.io/outdatedLauncherImage` label) and `vmi_pod`.
//! - `kubevirt_vmi_phase_count`: the VMIs per node, phase and the same system labels. Upstream
//!   turned it into a Prometheus recording rule over `kubevirt_vmi_info`; it is served here
//!   directly, so a scrape without Prometheus' rules still has it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kubevirt_api::constants::OUTDATED_LAUNCHER_IMAGE_LABEL;
use kubevirt_api::v1::VirtualMachineInstance;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::runtime::informer::InformerHandle;
use crate::runtime::metrics::ScrapeCollector;

const NONE: &str = "<none>";
const ANNOTATION_PREFIX: &str = "vm.kubevirt.io/";

/// Collects from the VMI informer's cache.
pub struct VmiCollector {
    vmis: InformerHandle<VirtualMachineInstance>,
    pods: InformerHandle<Pod>,
}

impl std::fmt::Debug for VmiCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmiCollector").finish_non_exhaustive()
    }
}

impl VmiCollector {
    /// A collector over the caches of VMIs and launcher pods.
    pub fn new(vmis: InformerHandle<VirtualMachineInstance>, pods: InformerHandle<Pod>) -> Self {
        Self { vmis, pods }
    }
}

/// The labels of one VMI's `kubevirt_vmi_info` sample, in upstream's order; `pod_name` names
/// a pod by its UID.
fn info_labels(
    vmi: &VirtualMachineInstance,
    pod_name: impl Fn(&str) -> Option<String>,
) -> Vec<(&'static str, String)> {
    let annotation = |key: &str| {
        vmi.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&format!("{ANNOTATION_PREFIX}{key}")))
            .cloned()
            .unwrap_or_else(|| NONE.to_owned())
    };
    let status = vmi.status.as_ref();
    let guest = status.and_then(|s| s.guest_os_info.as_ref());
    let guest_field =
        |f: fn(&kubevirt_api::v1::VirtualMachineInstanceGuestOsInfo) -> Option<&String>| {
            guest.and_then(f).cloned().unwrap_or_default()
        };
    let phase = status
        .and_then(|s| s.phase.as_ref())
        .map(|p| p.as_str().to_lowercase())
        .unwrap_or_default();
    let outdated = vmi
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(OUTDATED_LAUNCHER_IMAGE_LABEL));
    let pod = status
        .and_then(|s| {
            s.active_pods
                .iter()
                .find(|(_, node)| Some(*node) == s.node_name.as_ref())
        })
        .and_then(|(uid, _)| pod_name(uid))
        .unwrap_or_else(|| NONE.to_owned());
    vec![
        (
            "node",
            status.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        ),
        (
            "namespace",
            vmi.metadata.namespace.clone().unwrap_or_default(),
        ),
        ("name", vmi.metadata.name.clone().unwrap_or_default()),
        ("phase", phase),
        ("os", annotation("os")),
        ("workload", annotation("workload")),
        ("flavor", annotation("flavor")),
        ("instance_type", NONE.to_owned()),
        ("preference", NONE.to_owned()),
        (
            "guest_os_kernel_release",
            guest_field(|g| g.kernel_release.as_ref()),
        ),
        (
            "guest_os_machine",
            status
                .and_then(|s| s.machine.as_ref())
                .and_then(|m| m.type_.clone())
                .unwrap_or_default(),
        ),
        ("guest_os_arch", guest_field(|g| g.machine.as_ref())),
        ("guest_os_name", guest_field(|g| g.name.as_ref())),
        (
            "guest_os_version_id",
            guest_field(|g| g.version_id.as_ref()),
        ),
        ("evictable", evictable(vmi).to_string()),
        ("outdated", outdated.to_string()),
        ("vmi_pod", pod),
    ]
}

/// Whether draining the VMI's node can move it (upstream's `isVMEvictable`): its eviction
/// strategy is not `LiveMigrate`, or it is live-migratable.
fn evictable(vmi: &VirtualMachineInstance) -> bool {
    let live_migrate = vmi
        .spec
        .eviction_strategy
        .as_ref()
        .is_some_and(|s| s.as_str() == "LiveMigrate");
    !live_migrate
        || vmi.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_.as_str() == "LiveMigratable" && c.status.as_str() == "True")
        })
}

/// `kubevirt_vmi_phase_count`'s labels: the info labels less those of one VMI.
fn phase_count_labels(info: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    info.iter()
        .filter(|(k, _)| {
            !matches!(
                *k,
                "namespace" | "name" | "evictable" | "outdated" | "vmi_pod"
            )
        })
        .cloned()
        .collect()
}

impl ScrapeCollector for VmiCollector {
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let pods = self.pods.store().state();
        let pod_name = |uid: &str| {
            pods.iter()
                .find(|p| p.metadata.uid.as_deref() == Some(uid))
                .and_then(|p| p.metadata.name.clone())
        };
        let infos: Vec<_> = self
            .vmis
            .store()
            .state()
            .iter()
            .map(|vmi| info_labels(vmi, pod_name))
            .collect();
        let mut info = encoder.encode_descriptor(
            "kubevirt_vmi_info",
            "Information about VirtualMachineInstances.",
            None,
            MetricType::Gauge,
        )?;
        for labels in &infos {
            ConstGauge::new(1_i64).encode(info.encode_family(labels)?)?;
        }
        let mut counts: BTreeMap<Vec<(&'static str, String)>, i64> = BTreeMap::new();
        for labels in &infos {
            *counts.entry(phase_count_labels(labels)).or_default() += 1;
        }
        let mut phases = encoder.encode_descriptor(
            "kubevirt_vmi_phase_count",
            "Sum of VMIs per phase and node.",
            None,
            MetricType::Gauge,
        )?;
        for (labels, count) in &counts {
            ConstGauge::new(*count).encode(phases.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(name: &str, phase: &str, node: &str) -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default",
                         "annotations": {"vm.kubevirt.io/os": "linux"}},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": phase, "nodeName": node, "activePods": {"pod-uid": node},
                       "machine": {"type": "q35"}},
        }))
        .unwrap()
    }

    #[test]
    fn info_labels_follow_upstream_and_phase_counts_group_vmis() {
        let running = info_labels(&vmi("a", "Running", "n1"), |uid| {
            Some(format!("virt-launcher-{uid}"))
        });
        let get = |labels: &[(&str, String)], key: &str| {
            labels
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get(&running, "phase"), "running");
        assert_eq!(get(&running, "os"), "linux");
        assert_eq!(get(&running, "workload"), "<none>");
        assert_eq!(get(&running, "guest_os_machine"), "q35");
        assert_eq!(get(&running, "vmi_pod"), "virt-launcher-pod-uid");
        assert_eq!(get(&running, "evictable"), "true");
        let other = info_labels(&vmi("b", "Running", "n1"), |_| None);
        assert_eq!(phase_count_labels(&running), phase_count_labels(&other));
        let pending = info_labels(&vmi("c", "Pending", "n1"), |_| None);
        assert_ne!(phase_count_labels(&running), phase_count_labels(&pending));
    }
}
