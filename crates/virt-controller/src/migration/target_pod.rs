//! The migration target pod (upstream's `RenderMigrationManifest` for a local migration):
//! the VMI's launcher pod as the VMI controller renders it, plus
//! - the label `kubevirt.io/migrationJobUID=<migration UID>` and the annotation
//!   `kubevirt.io/migrationJobName=<migration name>`;
//! - `spec.addedNodeSelector` under the VMI's own selectors (the VMI's values win);
//! - upstream's required pod anti-affinity on `kubevirt.io/created-by=<VMI UID>` over
//!   `kubernetes.io/hostname`, and — because the embedded scheduler has no inter-pod
//!   affinity — a required node affinity `kubernetes.io/hostname NotIn [source node]`
//!   (upstream's form for a decentralized target), which says the same for one pod per VMI.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodAffinityTerm, PodAntiAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kubevirt_api::constants as c;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstanceMigration};

use crate::vmi::template::{LauncherPodConfig, TemplateError, render_launcher_pod};

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
}
