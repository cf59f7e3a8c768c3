//! What the workload controllers need to know about pods: active, ready, available (kube's
//! `podutil.IsPodAvailable`), a pod from a template, and kube's order of pods to delete.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The pod annotation that ranks pods for deletion: lower cost goes first.
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// Not terminal (`Succeeded`/`Failed`) and not being deleted: a pod that counts as a replica.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !is_terminal(pod)
}

/// `Succeeded` or `Failed`.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The pod's `Ready` condition is `True` (what the node agent reports).
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// When the pod last became ready, if it is ready.
fn ready_since(pod: &Pod) -> Option<jiff::Timestamp> {
    ready_condition(pod)
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// Ready for at least `min_ready_seconds` at `now` (kube: ready, and with a minimum, the
/// transition time plus the minimum is before now).
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    ready_since(pod).is_some_and(|since| {
        since + jiff::SignedDuration::from_secs(i64::from(min_ready_seconds)) < now
    })
}

/// How long until a ready pod becomes available, if it is ready but not available yet.
pub fn until_available(
    pod: &Pod,
    min_ready_seconds: i32,
    now: jiff::Timestamp,
) -> Option<std::time::Duration> {
    if min_ready_seconds <= 0 || is_available(pod, min_ready_seconds, now) {
        return None;
    }
    let since = ready_since(pod)?;
    let at = since + jiff::SignedDuration::from_secs(i64::from(min_ready_seconds));
    let wait = at.duration_since(now);
    std::time::Duration::try_from(wait)
        .ok()
        .map(|d| d + std::time::Duration::from_secs(1))
}

/// A pod for `template` owned by `owner`: the template's labels, annotations and finalizers,
/// `generateName: <prefix>-` (the API server appends five random characters), the spec.
pub fn pod_from_template(
    template: &PodTemplateSpec,
    namespace: &str,
    prefix: &str,
    owner: OwnerReference,
) -> Pod {
    let meta = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            namespace: Some(namespace.to_owned()),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

fn phase_rank(pod: &Pod) -> u8 {
    match phase(pod) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

fn deletion_cost(pod: &Pod) -> i64 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DELETION_COST_ANNOTATION))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0)
}

/// Orders `pods` so the ones to delete first come first, as kube's `ActivePodsWithRanks`:
/// unscheduled before scheduled; Pending before Unknown before Running; not ready before
/// ready; lower `pod-deletion-cost` first; more pods of the same owner on the node first;
/// ready for less time first; more restarts first; newer first.
pub fn sort_for_deletion(pods: &mut [std::sync::Arc<Pod>]) {
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in pods.iter() {
        if !node_name(p).is_empty() {
            *per_node.entry(node_name(p).to_owned()).or_default() += 1;
        }
    }
    let rank = |p: &Pod| per_node.get(node_name(p)).copied().unwrap_or(0);
    pods.sort_by(|a, b| {
        let assigned = |p: &Pod| !node_name(p).is_empty();
        assigned(a)
            .cmp(&assigned(b))
            .then_with(|| phase_rank(a).cmp(&phase_rank(b)))
            .then_with(|| is_ready(a).cmp(&is_ready(b)))
            .then_with(|| deletion_cost(a).cmp(&deletion_cost(b)))
            .then_with(|| rank(b).cmp(&rank(a)))
            .then_with(|| match (ready_since(a), ready_since(b)) {
                (Some(x), Some(y)) => y.cmp(&x),
                _ => Ordering::Equal,
            })
            .then_with(|| restarts(b).cmp(&restarts(a)))
            .then_with(|| {
                let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                match (created(a), created(b)) {
                    (None, Some(_)) => Ordering::Less,
                    (Some(_), None) => Ordering::Greater,
                    (x, y) => y.cmp(&x),
                }
            })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    #[allow(clippy::needless_pass_by_value)] // test fixtures read best with owned JSON
    fn pod(name: &str, extra: serde_json::Value) -> Arc<Pod> {
        let mut v = json!({"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:10Z"}]}});
        if let (Some(base), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, e) in extra {
                if let (Some(b), Some(e)) = (
                    base.get_mut(k).and_then(|b| b.as_object_mut()),
                    e.as_object(),
                ) {
                    for (kk, vv) in e {
                        b.insert(kk.clone(), vv.clone());
                    }
                }
            }
        }
        Arc::new(serde_json::from_value(v).expect("pod"))
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.metadata.name.as_deref().unwrap_or(""))
            .collect()
    }

    #[test]
    fn unscheduled_then_pending_then_not_ready_pods_are_deleted_first() {
        let mut pods = vec![
            pod("ready", json!({})),
            pod(
                "not-ready",
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
            pod("pending", json!({"status": {"phase": "Pending"}})),
            pod("unscheduled", json!({"spec": {"nodeName": null}})),
        ];
        sort_for_deletion(&mut pods);
        assert_eq!(
            names(&pods),
            ["unscheduled", "pending", "not-ready", "ready"]
        );
    }

    #[test]
    fn among_equal_pods_the_newer_goes_first() {
        let mut pods = vec![
            pod("old", json!({})),
            pod(
                "new",
                json!({"metadata": {"creationTimestamp": "2026-01-02T00:00:00Z"}}),
            ),
        ];
        sort_for_deletion(&mut pods);
        assert_eq!(names(&pods), ["new", "old"]);
    }

    #[test]
    fn availability_waits_for_min_ready_seconds() {
        let p = pod("p", json!({}));
        let at = |s: &str| s.parse::<jiff::Timestamp>().expect("time");
        assert!(is_available(&p, 0, at("2026-01-01T00:00:11Z")));
        assert!(!is_available(&p, 5, at("2026-01-01T00:00:12Z")));
        assert!(is_available(&p, 5, at("2026-01-01T00:00:16Z")));
        assert!(until_available(&p, 5, at("2026-01-01T00:00:12Z")).is_some());
    }
}
