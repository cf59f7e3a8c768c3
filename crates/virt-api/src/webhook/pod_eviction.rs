//! The pod-eviction webhook (`/pod-eviction-validate`, upstream's `PodEvictionAdmitter`):
//! what an eviction of a launcher pod (or of a hotplug attachment pod) means for its VMI.
//!
//! Flow: the pod named by the review is read (a failed read allows the eviction); a hotplug
//! pod whose launcher lives and whose VMI exists is refused; a live launcher pod's VMI (from
//! its `kubevirt.io/domain` annotation) is read and [`decide`] applies the effective eviction
//! strategy (the VMI's `spec.evictionStrategy`, else the KubeVirt CR's): `None` (or none)
//! lets the pod go, so the guest stops; `LiveMigrate` (if the VMI is `LiveMigratable`),
//! migratable `LiveMigrateIfPossible` and `External` mark the VMI with
//! `status.evacuationNodeName` (JSON Patch, dry run honoured) and refuse the eviction, so the
//! pod stays until the VMI has left the node. Every refusal has HTTP code 429, which
//! `kubectl drain` retries.
//!
//! # Caveats
//! Nothing here migrates a marked VMI: that is the evacuation and migration controllers'
//! job, which do not exist yet. A `LiveMigrate` VMI marked by a drain therefore stays on the
//! node, its launcher pod is refused eviction on every retry ("Evacuation in progress"), and
//! the drain does not finish until the VMI is stopped.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{
    EvictionStrategy, VirtualMachineInstance, VirtualMachineInstanceConditionType,
};
use serde_json::{Value, json};

/// The Eviction annotation the descheduler sets on its requests, and its value.
pub const REQUESTED_BY_ANNOTATION: &str = "requested-by";
/// See [`REQUESTED_BY_ANNOTATION`].
pub const REQUESTED_BY_DESCHEDULER: &str = "sigs.k8s.io/descheduler";
/// VMI annotation naming who asked for the evacuation.
pub const EVICTION_SOURCE_ANNOTATION: &str = "kubevirt.io/eviction-source";

/// What the webhook answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The eviction goes ahead.
    Allow,
    /// Refused with this message (HTTP 429).
    Deny(String),
    /// Mark the VMI for evacuation from this node, then refuse.
    Mark {
        /// The node to evacuate (the pod's).
        node: String,
    },
}

fn is_launcher(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(c::APP_LABEL))
        .is_some_and(|v| v == c::VIRT_LAUNCHER_VALUE)
}

fn is_hotplug(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(c::APP_LABEL))
        .is_some_and(|v| v == c::HOTPLUG_DISK_VALUE)
        && pod.metadata.owner_references.as_ref().map(Vec::len) == Some(1)
}

fn is_completed(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

fn domain_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(c::DOMAIN_ANNOTATION))
        .map(String::as_str)
}

/// Whether the VMI's `LiveMigratable` condition is `True` (upstream's `IsMigratable`).
pub fn is_migratable(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|cond| cond.is_true(&VirtualMachineInstanceConditionType::LiveMigratable))
    })
}

/// The effective eviction strategy: the VMI's, else the cluster's.
pub fn effective_strategy(
    vmi: &VirtualMachineInstance,
    cluster: Option<&EvictionStrategy>,
) -> Option<EvictionStrategy> {
    vmi.spec
        .eviction_strategy
        .clone()
        .or_else(|| cluster.cloned())
}

/// Upstream's `admitLauncherPod` decision for the live launcher pod `pod` of `vmi`.
pub fn decide(
    pod: &Pod,
    vmi: &VirtualMachineInstance,
    cluster: Option<&EvictionStrategy>,
) -> Verdict {
    let mark = match effective_strategy(vmi, cluster) {
        Some(EvictionStrategy::LiveMigrate) => {
            if !is_migratable(vmi) {
                return Verdict::Deny(format!(
                    "VMI {} is configured with an eviction strategy but is not live-migratable",
                    vmi.metadata.name.as_deref().unwrap_or_default()
                ));
            }
            true
        }
        Some(EvictionStrategy::LiveMigrateIfPossible) => is_migratable(vmi),
        Some(EvictionStrategy::External) => true,
        Some(EvictionStrategy::None | EvictionStrategy::Other(_)) | None => false,
    };
    if !mark {
        return Verdict::Allow;
    }
    let status = vmi.status.as_ref();
    if status
        .and_then(|s| s.evacuation_node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        return Verdict::Deny(format!(
            "Evacuation in progress: {}",
            triggered_message(vmi)
        ));
    }
    let pod_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if status
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
        != pod_node
    {
        return Verdict::Deny("Eviction request for target Pod".to_owned());
    }
    Verdict::Mark { node: pod_node }
}

/// The message format the descheduler expects.
pub fn triggered_message(vmi: &VirtualMachineInstance) -> String {
    format!(
        "Eviction triggered evacuation of VMI \"{}/{}\"",
        vmi.metadata.namespace.as_deref().unwrap_or_default(),
        vmi.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The JSON Patch that marks `vmi` for evacuation from `node` (upstream's `markVMI`).
pub fn mark_patch(vmi: &VirtualMachineInstance, node: &str, descheduler: bool) -> Value {
    let mut ops = vec![json!({"op": "add", "path": "/status/evacuationNodeName", "value": node})];
    if descheduler {
        let has_annotations = vmi
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| !a.is_empty());
        ops.push(if has_annotations {
            json!({"op": "replace", "path": "/metadata/annotations/kubevirt.io~1eviction-source", "value": "descheduler"})
        } else {
            json!({"op": "add", "path": "/metadata/annotations", "value": {EVICTION_SOURCE_ANNOTATION: "descheduler"}})
        });
    }
    Value::Array(ops)
}

/// Whether the review or the Eviction's `deleteOptions` ask for a dry run.
fn is_dry_run(request: &Value) -> bool {
    request["dryRun"] == true || request["object"]["deleteOptions"]["dryRun"][0] == "All"
}

/// Upstream's `Admit`: `Ok(None)` allows, `Ok(Some(message))` refuses with 429.
pub async fn admit(
    client: &kube::Client,
    request: &Value,
    cluster: Option<&EvictionStrategy>,
) -> Option<String> {
    let namespace = request["namespace"].as_str().unwrap_or_default();
    let name = request["name"].as_str().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let Ok(pod) = pods.get(name).await else {
        return None;
    };
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), namespace);
    if is_hotplug(&pod) {
        let owner = pod
            .metadata
            .owner_references
            .as_ref()?
            .first()?
            .name
            .clone();
        let owner = match pods.get_opt(&owner).await {
            Ok(Some(owner)) => owner,
            Ok(None) => return None,
            Err(e) => return Some(format!("failed getting owner for hotplug pod: {e}")),
        };
        if !is_launcher(&owner) || is_completed(&owner) {
            return None;
        }
        let vmi_name = domain_of(&owner)?.to_owned();
        return match vmis.get_opt(&vmi_name).await {
            Ok(Some(_)) => Some(format!(
                "cannot evict hotplug pod: {name} associated with running vmi: {vmi_name} in namespace {namespace}"
            )),
            Ok(None) => None,
            Err(e) => Some(format!("kubevirt failed getting the vmi: {e}")),
        };
    }
    if !is_launcher(&pod) || is_completed(&pod) {
        return None;
    }
    let vmi_name = domain_of(&pod)?;
    let vmi = match vmis.get(vmi_name).await {
        Ok(vmi) => vmi,
        Err(e) => return Some(format!("kubevirt failed getting the vmi: {e}")),
    };
    match decide(&pod, &vmi, cluster) {
        Verdict::Allow => None,
        Verdict::Deny(message) => Some(message),
        Verdict::Mark { node } => {
            let descheduler = request["object"]["metadata"]["annotations"][REQUESTED_BY_ANNOTATION]
                == REQUESTED_BY_DESCHEDULER;
            let patch = match serde_json::from_value::<json_patch::Patch>(mark_patch(
                &vmi,
                &node,
                descheduler,
            )) {
                Ok(p) => p,
                Err(e) => {
                    return Some(format!("kubevirt failed marking the vmi for eviction: {e}"));
                }
            };
            let params = PatchParams {
                dry_run: is_dry_run(request),
                ..PatchParams::default()
            };
            match vmis
                .patch(vmi_name, &params, &Patch::<()>::Json(patch))
                .await
            {
                Ok(_) => Some(triggered_message(&vmi)),
                Err(e) => Some(format!("kubevirt failed marking the vmi for eviction: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "virt-launcher-vm-abcde", "namespace": "ns",
                         "labels": {"kubevirt.io": "virt-launcher"},
                         "annotations": {"kubevirt.io/domain": "vm"}},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running"},
        }))
        .expect("pod")
    }

    fn vmi(strategy: Option<&str>, migratable: bool, extra: &Value) -> VirtualMachineInstance {
        let mut v = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "ns"},
            "spec": {"domain": {"devices": {}}},
            "status": {"nodeName": "node01", "conditions": [
                {"type": "LiveMigratable", "status": if migratable { "True" } else { "False" }}]},
        });
        if let Some(s) = strategy {
            v["spec"]["evictionStrategy"] = json!(s);
        }
        if let Some(status) = extra.as_object() {
            for (k, val) in status {
                v["status"][k] = val.clone();
            }
        }
        serde_json::from_value(v).expect("vmi")
    }

    #[test]
    fn none_or_no_strategy_lets_the_pod_go() {
        let p = pod("node01");
        assert_eq!(
            decide(&p, &vmi(Some("None"), true, &json!({})), None),
            Verdict::Allow
        );
        assert_eq!(
            decide(&p, &vmi(None, true, &json!({})), None),
            Verdict::Allow
        );
        assert_eq!(
            decide(
                &p,
                &vmi(None, false, &json!({})),
                Some(&EvictionStrategy::LiveMigrateIfPossible)
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn the_cluster_default_applies_when_the_vmi_sets_none() {
        let p = pod("node01");
        assert_eq!(
            decide(
                &p,
                &vmi(None, true, &json!({})),
                Some(&EvictionStrategy::External)
            ),
            Verdict::Mark {
                node: "node01".into()
            }
        );
        // The VMI's own strategy wins.
        assert_eq!(
            decide(
                &p,
                &vmi(Some("None"), true, &json!({})),
                Some(&EvictionStrategy::External)
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn live_migrate_needs_a_migratable_vmi() {
        let p = pod("node01");
        assert_eq!(
            decide(&p, &vmi(Some("LiveMigrate"), false, &json!({})), None),
            Verdict::Deny(
                "VMI vm is configured with an eviction strategy but is not live-migratable".into()
            )
        );
        assert_eq!(
            decide(&p, &vmi(Some("LiveMigrate"), true, &json!({})), None),
            Verdict::Mark {
                node: "node01".into()
            }
        );
        assert_eq!(
            decide(
                &p,
                &vmi(Some("LiveMigrateIfPossible"), true, &json!({})),
                None
            ),
            Verdict::Mark {
                node: "node01".into()
            }
        );
    }

    #[test]
    fn a_marked_vmi_or_a_target_pod_is_refused() {
        let marked = vmi(
            Some("External"),
            false,
            &json!({"evacuationNodeName": "node01"}),
        );
        assert_eq!(
            decide(&pod("node01"), &marked, None),
            Verdict::Deny(
                "Evacuation in progress: Eviction triggered evacuation of VMI \"ns/vm\"".into()
            )
        );
        assert_eq!(
            decide(
                &pod("node02"),
                &vmi(Some("External"), false, &json!({})),
                None
            ),
            Verdict::Deny("Eviction request for target Pod".into())
        );
    }

    #[test]
    fn the_mark_patch_adds_the_node_and_the_descheduler_source() {
        let v = vmi(None, true, &json!({}));
        assert_eq!(
            mark_patch(&v, "node01", false),
            json!([{"op": "add", "path": "/status/evacuationNodeName", "value": "node01"}])
        );
        assert_eq!(
            mark_patch(&v, "node01", true)[1],
            json!({"op": "add", "path": "/metadata/annotations",
                   "value": {"kubevirt.io/eviction-source": "descheduler"}})
        );
        assert!(is_dry_run(
            &json!({"dryRun": false, "object": {"deleteOptions": {"dryRun": ["All"]}}})
        ));
        assert!(!is_dry_run(&json!({"dryRun": false, "object": {}})));
    }
}
