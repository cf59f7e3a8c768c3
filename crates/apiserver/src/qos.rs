//! A pod's quality-of-service class (`status.qosClass`), as kube-apiserver computes it when
//! the pod is created (after defaulting and mutating admission) and kubelet reports it after.
//!
//! Rules (Kubernetes' `GetPodQOS`), over the containers and init containers and the
//! resources `cpu` and `memory` only, zero amounts not counted:
//! - no request and no limit anywhere → `BestEffort`;
//! - every container limits both `cpu` and `memory`, and the summed requests equal the
//!   summed limits for each (requests default to limits before this runs) → `Guaranteed`;
//! - otherwise → `Burstable`.
//!
//! An amount that does not parse counts as not set (validation rejects such a pod anyway).

use std::collections::BTreeMap;

use k8s_quantity::Quantity;
use serde_json::Value;

const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// The QoS class of the pod `pod` (a JSON object).
pub fn pod_qos_class(pod: &Value) -> &'static str {
    let spec = &pod["spec"];
    let containers = ["containers", "initContainers"]
        .into_iter()
        .filter_map(|k| spec[k].as_array())
        .flatten();
    let mut requests: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut guaranteed = true;
    for container in containers {
        let resources = &container["resources"];
        let add = |into: &mut BTreeMap<&'static str, Quantity>, kind: &str| {
            let mut named = 0;
            for name in QOS_RESOURCES {
                let Some(q) = resources[kind][name]
                    .as_str()
                    .and_then(|s| Quantity::parse(s).ok())
                    .filter(|q| *q != Quantity::ZERO)
                else {
                    continue;
                };
                named += 1;
                let sum = match into.remove(name) {
                    Some(old) => old.checked_add(q).unwrap_or(q),
                    None => q,
                };
                into.insert(name, sum);
            }
            named
        };
        add(&mut requests, "requests");
        if add(&mut limits, "limits") < QOS_RESOURCES.len() {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    let limits_match = requests.iter().all(|(name, q)| limits.get(name) == Some(q));
    if guaranteed && limits_match && requests.len() == limits.len() {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: &Value) -> Value {
        json!({"spec": {"containers": containers}})
    }

    #[test]
    fn classes_follow_the_requests_and_limits_of_cpu_and_memory() {
        let cases = [
            ("no resources", json!([{"name": "a"}]), "BestEffort"),
            (
                "only other resources",
                json!([{"name": "a", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}]),
                "BestEffort",
            ),
            (
                "zero requests",
                json!([{"name": "a", "resources": {"requests": {"cpu": "0", "memory": "0"}}}]),
                "BestEffort",
            ),
            (
                "a memory request (a launcher pod)",
                json!([{"name": "compute", "resources": {"requests": {"memory": "180Mi"}}},
                       {"name": "guest-console-log", "resources": {}}]),
                "Burstable",
            ),
            (
                "limits equal to requests in every container",
                json!([
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                "limits": {"cpu": "1000m", "memory": "1024Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                "limits": {"cpu": "100m", "memory": "64Mi"}}}
                ]),
                "Guaranteed",
            ),
            (
                "one container without limits",
                json!([
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                "limits": {"cpu": "1", "memory": "1Gi"}}},
                    {"name": "b"}
                ]),
                "Burstable",
            ),
            (
                "a request below its limit",
                json!([{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                                   "limits": {"cpu": "1", "memory": "1Gi"}}}]),
                "Burstable",
            ),
        ];
        for (what, containers, want) in cases {
            assert_eq!(pod_qos_class(&pod(&containers)), want, "{what}");
        }
    }

    #[test]
    fn init_containers_count_too() {
        let pod = json!({"spec": {
            "containers": [{"name": "a"}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "10m"}}}]
        }});
        assert_eq!(pod_qos_class(&pod), "Burstable");
    }
}
