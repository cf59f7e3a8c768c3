//! Pure scheduling predicates: does a pod fit a node, and which node to choose.
//!
//! The embedded scheduler plays kube-scheduler for launcher pods on one machine, so it
//! implements the filters that matter there — node readiness and `unschedulable`,
//! taints/tolerations, `nodeSelector`, required node affinity, and resource requests
//! (cpu, memory, pods, extended resources such as `devices.kubevirt.io/kvm`) against
//! allocatable minus what the node's other pods request — and, among the nodes that fit,
//! picks the one with the most free memory. Messages follow kube-scheduler's
//! `0/N nodes are available: …` form.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_quantity::Quantity as ExactQuantity;

/// Thousandths of a resource quantity, rounded up as kube-scheduler's `MilliValue()` rounds;
/// `None` when it does not parse.
fn milli(q: &Quantity) -> Option<i128> {
    ExactQuantity::try_from(q).ok().map(|q| q.milli_value())
}

/// Why a node was filtered out; the `Display` form is kube-scheduler's phrase.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unfit {
    NotReady,
    Unschedulable,
    UntoleratedTaint(String),
    NodeSelectorMismatch,
    Insufficient(String),
    /// A bound volume of the pod cannot be used on the node (its node affinity).
    VolumeNodeAffinityConflict,
    /// An unbound claim of the pod has no volume it could bind on the node.
    NoVolumeToBind,
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::NotReady => write!(f, "node(s) were not ready"),
            Unfit::Unschedulable => write!(f, "node(s) were unschedulable"),
            Unfit::UntoleratedTaint(t) => write!(f, "node(s) had untolerated taint {{{t}}}"),
            Unfit::NodeSelectorMismatch => {
                write!(f, "node(s) didn't match Pod's node affinity/selector")
            }
            Unfit::Insufficient(r) => write!(f, "Insufficient {r}"),
            Unfit::VolumeNodeAffinityConflict => {
                write!(f, "node(s) had volume node affinity conflict")
            }
            Unfit::NoVolumeToBind => {
                write!(
                    f,
                    "node(s) didn't find available persistent volumes to bind"
                )
            }
        }
    }
}

/// The resources a pod requests: the larger of the sum of its containers and the largest
/// init container, per resource, plus one `pods` slot.
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, i128> {
    let mut total: BTreeMap<String, i128> = BTreeMap::new();
    let Some(spec) = &pod.spec else { return total };
    for container in &spec.containers {
        for (name, q) in container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
        {
            *total.entry(name.clone()).or_default() += milli(q).unwrap_or(0);
        }
    }
    for container in spec.init_containers.iter().flatten() {
        for (name, q) in container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
        {
            let v = milli(q).unwrap_or(0);
            let entry = total.entry(name.clone()).or_default();
            *entry = (*entry).max(v);
        }
    }
    *total.entry("pods".to_owned()).or_default() += 1000;
    total
}

fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether a toleration of `tolerations` tolerates `taint` (kube's `ToleratesTaint`).
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        };
        effect_ok && key_ok && value_ok
    })
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if op == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let name = node.metadata.name.as_deref();
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, name))
}

fn selector_matches(pod: &Pod, node: &Node) -> bool {
    pod.spec
        .as_ref()
        .is_none_or(|spec| node_selectors_match(spec, node))
}

/// Whether `node` satisfies the pod spec's `nodeSelector` and required node affinity (kube's
/// `NodeAffinity` filter; the DaemonSet controller asks the same question).
pub fn node_selectors_match(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let affinity_ok = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_none_or(|sel| {
            sel.node_selector_terms
                .iter()
                .any(|t| term_matches(t, node))
        });
    selector_ok && affinity_ok
}

/// Checks one node; `requested_on_node` is what the node's other (non-terminated) pods request.
pub fn fits(
    pod: &Pod,
    node: &Node,
    requested_on_node: &BTreeMap<String, i128>,
) -> Result<(), Unfit> {
    if !node_is_ready(node) {
        return Err(Unfit::NotReady);
    }
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Err(Unfit::Unschedulable);
    }
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    for taint in spec.and_then(|s| s.taints.as_deref()).unwrap_or_default() {
        if (taint.effect == "NoSchedule" || taint.effect == "NoExecute")
            && !tolerates(&tolerations, taint)
        {
            let value = taint
                .value
                .as_deref()
                .map(|v| format!(": {v}"))
                .unwrap_or_default();
            return Err(Unfit::UntoleratedTaint(format!("{}{value}", taint.key)));
        }
    }
    if !selector_matches(pod, node) {
        return Err(Unfit::NodeSelectorMismatch);
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (resource, want) in pod_requests(pod) {
        if want <= 0 {
            continue;
        }
        let have = allocatable
            .and_then(|a| a.get(&resource))
            .and_then(milli)
            .unwrap_or(0);
        let used = requested_on_node.get(&resource).copied().unwrap_or(0);
        if used + want > have {
            return Err(Unfit::Insufficient(resource));
        }
    }
    Ok(())
}

/// Picks a node for `pod`: among the nodes that fit, the one with the most unrequested memory
/// (ties → name order). `requested` maps node name → what its pods already request.
/// On failure returns kube-scheduler's message, e.g.
/// `0/1 nodes are available: 1 Insufficient memory.`
pub fn choose_node<'a>(
    pod: &Pod,
    nodes: &'a [Node],
    requested: &BTreeMap<String, BTreeMap<String, i128>>,
) -> Result<&'a Node, String> {
    choose_node_with(pod, nodes, requested, |_| Ok(()))
}

/// [`choose_node`] with one more filter, `extra`, run after the others (the volume filter).
///
/// # Errors
/// kube-scheduler's message when no node fits.
pub fn choose_node_with<'a>(
    pod: &Pod,
    nodes: &'a [Node],
    requested: &BTreeMap<String, BTreeMap<String, i128>>,
    extra: impl Fn(&Node) -> Result<(), Unfit>,
) -> Result<&'a Node, String> {
    let empty = BTreeMap::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<(&Node, i128)> = None;
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let used = requested.get(&name).unwrap_or(&empty);
        match fits(pod, node, used).and_then(|()| extra(node)) {
            Ok(()) => {
                let free = node
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref())
                    .and_then(|a| a.get("memory"))
                    .and_then(milli)
                    .unwrap_or(0)
                    - used.get("memory").copied().unwrap_or(0);
                if best.is_none_or(|(_, f)| free > f) {
                    best = Some((node, free));
                }
            }
            Err(why) => *reasons.entry(why.to_string()).or_default() += 1,
        }
    }
    if let Some((node, _)) = best {
        return Ok(node);
    }
    let detail: Vec<String> = reasons
        .iter()
        .map(|(why, n)| format!("{n} {why}"))
        .collect();
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(" {}", detail.join(", "))
    };
    Err(format!("0/{} nodes are available:{detail}.", nodes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, extra: serde_json::Value) -> Node {
        let mut base = json!({
            "metadata": {"name": name, "labels": {"kubevirt.io/schedulable": "true"}},
            "spec": {},
            "status": {
                "allocatable": {"cpu": "2", "memory": "1Gi", "pods": "110", "devices.kubevirt.io/kvm": "1k"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        merge(&mut base, extra);
        serde_json::from_value(base).expect("node")
    }

    fn pod(extra: serde_json::Value) -> Pod {
        let mut base = json!({
            "metadata": {"name": "virt-launcher-a-xyz", "namespace": "default"},
            "spec": {
                "nodeSelector": {"kubevirt.io/schedulable": "true"},
                "containers": [{"name": "compute", "image": "virt-launcher",
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi", "devices.kubevirt.io/kvm": "1"}}}]
            }
        });
        merge(&mut base, extra);
        serde_json::from_value(base).expect("pod")
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    #[test]
    fn launcher_pod_fits_a_ready_schedulable_node() {
        let nodes = [node("n1", json!({}))];
        let chosen = choose_node(&pod(json!({})), &nodes, &BTreeMap::new()).expect("fits");
        assert_eq!(chosen.metadata.name.as_deref(), Some("n1"));
    }

    #[test]
    fn memory_already_requested_makes_the_pod_unschedulable() {
        let nodes = [node("n1", json!({}))];
        let used = BTreeMap::from([(
            "n1".to_owned(),
            BTreeMap::from([(
                "memory".to_owned(),
                milli(&Quantity("900Mi".to_owned())).expect("q"),
            )]),
        )]);
        let err = choose_node(&pod(json!({})), &nodes, &used).expect_err("unfit");
        assert_eq!(err, "0/1 nodes are available: 1 Insufficient memory.");
    }

    #[test]
    fn node_selector_taints_and_readiness_filter_nodes() {
        let nodes = [
            node(
                "not-ready",
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
            node(
                "tainted",
                json!({"spec": {"taints": [{"key": "kubevirt.io/drain", "effect": "NoSchedule"}]}}),
            ),
            node(
                "unlabelled",
                json!({"metadata": {"labels": {"kubevirt.io/schedulable": "false"}}}),
            ),
        ];
        let err = choose_node(&pod(json!({})), &nodes, &BTreeMap::new()).expect_err("unfit");
        assert_eq!(
            err,
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) had untolerated taint {kubevirt.io/drain}, 1 node(s) were not ready."
        );
    }

    #[test]
    fn a_toleration_admits_a_tainted_node() {
        let nodes = [node(
            "tainted",
            json!({"spec": {"taints": [{"key": "dedicated", "value": "vm", "effect": "NoSchedule"}]}}),
        )];
        let p = pod(
            json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "vm", "effect": "NoSchedule"}]}}),
        );
        assert!(choose_node(&p, &nodes, &BTreeMap::new()).is_ok());
    }

    #[test]
    fn required_node_affinity_is_honoured() {
        let nodes = [node("a", json!({})), node("b", json!({}))];
        let p = pod(
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}}}),
        );
        let chosen = choose_node(&p, &nodes, &BTreeMap::new()).expect("fits");
        assert_eq!(chosen.metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn the_node_with_most_free_memory_wins() {
        let nodes = [
            node("small", json!({})),
            node("big", json!({"status": {"allocatable": {"memory": "8Gi"}}})),
        ];
        let chosen = choose_node(&pod(json!({})), &nodes, &BTreeMap::new()).expect("fits");
        assert_eq!(chosen.metadata.name.as_deref(), Some("big"));
    }

    #[test]
    fn requests_finer_than_a_milli_unit_round_up() {
        let p = pod(json!({"spec": {"containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": "0.0001", "memory": "1.5Gi"}}}]}}));
        let req = pod_requests(&p);
        assert_eq!(req.get("cpu"), Some(&1));
        assert_eq!(req.get("memory"), Some(&(1536 * 1024 * 1024 * 1000)));
    }

    #[test]
    fn init_containers_count_by_their_maximum() {
        let p = pod(
            json!({"spec": {"initContainers": [{"name": "init", "image": "x",
            "resources": {"requests": {"memory": "512Mi"}}}]}}),
        );
        let req = pod_requests(&p);
        assert_eq!(
            req.get("memory"),
            milli(&Quantity("512Mi".to_owned())).as_ref()
        );
        assert_eq!(req.get("pods"), Some(&1000));
    }
}
