//! The migration target pod (upstream's `RenderMigrationManifest` for a local migration):
//! the VMI's launcher pod as the VMI controller renders it, plus
//! - the label `kubevirt.io/migrationJobUID=<migration UID>` and the annotation
//!   `kubevirt.io/migrationJobName=<migration name>`;
//! - `spec.addedNodeSelector` under the VMI's own selectors (the VMI's values win);
//! - upstream's required pod anti-affinity on `kubevirt.io/created-by=<VMI UID>` over
//!   `kubernetes.io/hostname`, and — because the embedded scheduler has no inter-pod
//!   affinity — a required node affinity `kubernetes.io/hostname NotIn [source node]`
//!   (upstream's form for a decentralized target), which says the same for one pod per VMI;
//! - the CPU placement ([`add_cpu_placement`]): a `host-model` guest goes only to nodes whose
//!   CPU can run the source's host model, and every guest only to nodes of the source's CPU
//!   vendor.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodAffinityTerm, PodAntiAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

use kubevirt_api::constants as c;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstanceMigration};

use crate::vmi::template::{LauncherPodConfig, TemplateError, render_launcher_pod};

/// Node label prefix (`true`): a CPU model a `host-model` guest may migrate to (upstream's
/// `SupportedHostModelMigrationCPU`).
pub const CPU_MODEL_MIGRATION_PREFIX: &str = "cpu-model-migration.node.kubevirt.io/";
/// Node label prefix: the node's host CPU model (upstream's `HostModelCPULabel`).
pub const HOST_MODEL_PREFIX: &str = "host-model-cpu.node.kubevirt.io/";
/// Node label prefix: a feature the host model needs besides its named model (upstream's
/// `HostModelRequiredFeaturesLabel`).
pub const HOST_MODEL_REQUIRED_FEATURES_PREFIX: &str =
    "host-model-required-features.node.kubevirt.io/";
/// Node label prefix: the host CPU's vendor (upstream's `CPUModelVendorLabel`).
pub const CPU_VENDOR_PREFIX: &str = "cpu-vendor.node.kubevirt.io/";

/// The node label the scheduler spreads on.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Renders the target pod of `migration` for `vmi`, which runs on `source_node`.
///
/// # Errors
/// When the launcher pod cannot be rendered.
pub fn render_target_pod(
    vmi: &VirtualMachineInstance,
    migration: &VirtualMachineInstanceMigration,
    source_node: &str,
    config: &LauncherPodConfig,
) -> Result<Pod, TemplateError> {
    let mut pod = render_launcher_pod(vmi, config)?;
    let uid = migration.metadata.uid.clone().unwrap_or_default();
    let name = migration.metadata.name.clone().unwrap_or_default();
    pod.metadata
        .labels
        .get_or_insert_default()
        .insert(c::MIGRATION_JOB_LABEL.to_owned(), uid);
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert(c::MIGRATION_JOB_NAME_ANNOTATION.to_owned(), name);
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(pod);
    };
    let selector = spec.node_selector.get_or_insert_default();
    for (k, v) in &migration.spec.added_node_selector {
        selector.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let vmi_uid = vmi.metadata.uid.clone().unwrap_or_default();
    affinity
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_default()
        .push(PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some([(c::CREATED_BY_LABEL.to_owned(), vmi_uid)].into()),
                ..LabelSelector::default()
            }),
            topology_key: HOSTNAME_LABEL.to_owned(),
            ..PodAffinityTerm::default()
        });
    let not_source = NodeSelectorRequirement {
        key: HOSTNAME_LABEL.to_owned(),
        operator: "NotIn".to_owned(),
        values: Some(vec![source_node.to_owned()]),
    };
    let required = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    // Terms are ORed: every one of them must exclude the source node.
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_default()
            .push(not_source.clone());
    }
    Ok(pod)
}

/// Adds upstream's CPU placement of a migration target to its pod's `selector`
/// (`prepareNodeSelectorForHostCpuModel` and the same-vendor rule), from the labels of the
/// source node and the source pod's own node selector:
/// - a `host-model` guest: the source pod's `cpu-model-migration…`/`cpu-feature…` selectors
///   when it has any (the guest migrated before, and keeps the model it booted with), else
///   the source node's host model as `cpu-model-migration.node.kubevirt.io/<model>` and its
///   required features as `cpu-feature.node.kubevirt.io/<feature>`;
/// - every guest: the source node's `cpu-vendor.node.kubevirt.io/<vendor>` unless the
///   selector names a vendor already.
///
/// # Errors
/// When a `host-model` guest's source node has no host-model label (upstream's message).
pub fn add_cpu_placement(
    selector: &mut BTreeMap<String, String>,
    vmi: &VirtualMachineInstance,
    source_node_labels: &BTreeMap<String, String>,
    source_pod_selector: &BTreeMap<String, String>,
) -> Result<(), String> {
    if is_host_model(vmi) {
        let migrated_before: BTreeMap<String, String> = source_pod_selector
            .iter()
            .filter(|(k, _)| {
                k.contains(c::CPU_FEATURE_LABEL_PREFIX) || k.contains(CPU_MODEL_MIGRATION_PREFIX)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if migrated_before.is_empty() {
            selector.extend(host_model_selector(source_node_labels)?);
        } else {
            selector.extend(migrated_before);
        }
    }
    let vendor = source_node_labels
        .keys()
        .find(|k| k.starts_with(CPU_VENDOR_PREFIX));
    if let Some(vendor) =
        vendor.filter(|_| !selector.keys().any(|k| k.starts_with(CPU_VENDOR_PREFIX)))
    {
        selector.insert(vendor.clone(), "true".to_owned());
    }
    Ok(())
}

/// Whether the guest's CPU model is `host-model` (the default the mutator fills in).
pub fn is_host_model(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec
        .domain
        .cpu
        .as_ref()
        .and_then(|c| c.model.as_deref())
        == Some(kubevirt_api::v1::domain::CPU_MODEL_HOST_MODEL)
}

/// The node's host model and its required features as target selectors.
fn host_model_selector(
    node_labels: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut model = None;
    for (key, value) in node_labels {
        if let Some(m) = key.strip_prefix(HOST_MODEL_PREFIX) {
            model = Some((m, value));
        }
        if let Some(f) = key.strip_prefix(HOST_MODEL_REQUIRED_FEATURES_PREFIX) {
            out.insert(format!("{}{f}", c::CPU_FEATURE_LABEL_PREFIX), value.clone());
        }
    }
    let Some((model, value)) = model.filter(|(m, _)| !m.is_empty()) else {
        return Err(format!(
            "unable to locate host cpu model, does not contain label \"{HOST_MODEL_PREFIX}\" with information"
        ));
    };
    out.insert(
        format!("{CPU_MODEL_MIGRATION_PREFIX}{model}"),
        value.clone(),
    );
    Ok(out)
}

/// The target's CPU selectors that matter for a `host-model` guest (upstream's
/// `alertIfHostModelIsUnschedulable`): the nodes other than the source must have them all.
pub fn host_model_requirements(selector: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    selector
        .iter()
        .filter(|(k, _)| {
            k.starts_with(CPU_MODEL_MIGRATION_PREFIX) || k.starts_with(c::CPU_FEATURE_LABEL_PREFIX)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_target_pod_is_labelled_with_the_migration_and_kept_off_the_source_node() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "default", "uid": "vmi-uid"},
            "spec": {"domain": {"devices": {}, "memory": {"guest": "64Mi"}}, "nodeSelector": {"disk": "ssd"}},
        }))
        .expect("vmi");
        let migration: VirtualMachineInstanceMigration = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "m", "namespace": "default", "uid": "m-uid"},
            "spec": {"vmiName": "a", "addedNodeSelector": {"disk": "hdd", "zone": "b"}},
        }))
        .expect("migration");
        let pod = render_target_pod(&vmi, &migration, "node01", &LauncherPodConfig::default())
            .expect("pod");
        let pod = serde_json::to_value(&pod).expect("json");
        assert_eq!(pod["metadata"]["labels"][c::MIGRATION_JOB_LABEL], "m-uid");
        assert_eq!(
            pod["metadata"]["annotations"][c::MIGRATION_JOB_NAME_ANNOTATION],
            "m"
        );
        assert_eq!(
            pod["spec"]["nodeSelector"]["disk"], "ssd",
            "the VMI's value wins"
        );
        assert_eq!(pod["spec"]["nodeSelector"]["zone"], "b");
        let anti = &pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0];
        assert_eq!(anti["topologyKey"], HOSTNAME_LABEL);
        assert_eq!(
            anti["labelSelector"]["matchLabels"][c::CREATED_BY_LABEL],
            "vmi-uid"
        );
        assert_eq!(
            pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0],
            json!({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["node01"]})
        );
    }

    fn host_model_vmi() -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "default", "uid": "vmi-uid"},
            "spec": {"domain": {"devices": {}, "cpu": {"model": "host-model"}}},
        }))
        .expect("vmi")
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_host_model_guest_follows_the_source_nodes_host_model_and_vendor() {
        let node = labels(&[
            (
                "host-model-cpu.node.kubevirt.io/Skylake-Client-IBRS",
                "true",
            ),
            ("host-model-required-features.node.kubevirt.io/vmx", "true"),
            (
                "host-model-required-features.node.kubevirt.io/pdpe1gb",
                "true",
            ),
            ("cpu-vendor.node.kubevirt.io/Intel", "true"),
            ("cpu-model.node.kubevirt.io/Haswell", "true"),
            ("kubernetes.io/hostname", "node01"),
        ]);
        let mut selector = labels(&[("disk", "ssd")]);
        add_cpu_placement(&mut selector, &host_model_vmi(), &node, &BTreeMap::new())
            .expect("placement");
        assert_eq!(
            selector,
            labels(&[
                ("disk", "ssd"),
                (
                    "cpu-model-migration.node.kubevirt.io/Skylake-Client-IBRS",
                    "true"
                ),
                ("cpu-feature.node.kubevirt.io/vmx", "true"),
                ("cpu-feature.node.kubevirt.io/pdpe1gb", "true"),
                ("cpu-vendor.node.kubevirt.io/Intel", "true"),
            ])
        );
        assert_eq!(
            host_model_requirements(&selector).len(),
            3,
            "the model and the two features are what another node must have"
        );
    }

    #[test]
    fn a_guest_that_migrated_before_keeps_its_first_nodes_model() {
        let node = labels(&[("host-model-cpu.node.kubevirt.io/EPYC", "true")]);
        let source_pod = labels(&[
            (
                "cpu-model-migration.node.kubevirt.io/Skylake-Client-IBRS",
                "true",
            ),
            ("cpu-feature.node.kubevirt.io/vmx", "true"),
            ("cpu-vendor.node.kubevirt.io/Intel", "true"),
            ("disk", "ssd"),
        ]);
        let mut selector = BTreeMap::new();
        add_cpu_placement(&mut selector, &host_model_vmi(), &node, &source_pod).expect("placement");
        assert_eq!(
            selector,
            labels(&[
                (
                    "cpu-model-migration.node.kubevirt.io/Skylake-Client-IBRS",
                    "true"
                ),
                ("cpu-feature.node.kubevirt.io/vmx", "true"),
            ]),
            "not the node's current host model; no vendor to add from this node"
        );
    }

    #[test]
    fn a_host_model_guest_on_a_node_without_a_host_model_label_cannot_migrate() {
        let err = add_cpu_placement(
            &mut BTreeMap::new(),
            &host_model_vmi(),
            &labels(&[("cpu-vendor.node.kubevirt.io/AMD", "true")]),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "unable to locate host cpu model, does not contain label \"host-model-cpu.node.kubevirt.io/\" with information"
        );
    }

    #[test]
    fn a_named_model_guest_only_gets_the_vendor() {
        let mut vmi = host_model_vmi();
        vmi.spec.domain.cpu.as_mut().expect("cpu").model = Some("Haswell".into());
        let node = labels(&[
            ("host-model-cpu.node.kubevirt.io/EPYC", "true"),
            ("cpu-vendor.node.kubevirt.io/AMD", "true"),
        ]);
        let mut selector = labels(&[("cpu-model.node.kubevirt.io/Haswell", "true")]);
        add_cpu_placement(&mut selector, &vmi, &node, &BTreeMap::new()).expect("placement");
        assert_eq!(
            selector,
            labels(&[
                ("cpu-model.node.kubevirt.io/Haswell", "true"),
                ("cpu-vendor.node.kubevirt.io/AMD", "true"),
            ])
        );
    }
}
