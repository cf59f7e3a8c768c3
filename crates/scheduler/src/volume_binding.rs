//! kube-scheduler's `VolumeBinding` plugin, for one machine: what a pod's
//! `persistentVolumeClaim` volumes say about where and when it can be bound.
//!
//! - PreFilter ([`pre_filter`]): every claim must exist and not be being deleted
//!   (`persistentvolumeclaim "x" not found`, `… is being deleted`); an unbound claim of an
//!   `Immediate` class (or of no class) makes the pod wait for the PV controller (`pod has
//!   unbound immediate PersistentVolumeClaims`); a bound claim's volume must exist.
//! - Filter ([`PodVolumes::admits`]): a node must satisfy the node affinity of every bound
//!   volume (`node(s) had volume node affinity conflict`).
//! - Reserve / PreBind: unbound claims of a `WaitForFirstConsumer` class get the chosen node
//!   as [`SELECTED_NODE`]; the pod is bound only once all its claims are `Bound` (the
//!   provisioned volume's affinity then pins the pod to the selected node).
//!
//! # Caveats
//! - The node of a `WaitForFirstConsumer` claim is chosen without looking at pre-created
//!   volumes or storage capacity; the PV controller binds a matching volume on that node if
//!   there is one, else provisions.
//! - A pod waiting for its claims holds no resources of the node it was given.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::fit::Unfit;

/// The annotation naming the node of a `WaitForFirstConsumer` claim.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The claims, volumes and classes the scheduler sees.
#[derive(Clone, Copy, Default)]
pub struct Volumes<'a> {
    pub claims: &'a [Arc<PersistentVolumeClaim>],
    pub volumes: &'a [Arc<PersistentVolume>],
    pub classes: &'a [Arc<StorageClass>],
}

/// What a schedulable pod's claims need.
#[derive(Debug, Default)]
pub struct PodVolumes {
    /// The volumes of its bound claims.
    pub bound: Vec<Arc<PersistentVolume>>,
    /// Its unbound `WaitForFirstConsumer` claims with no node yet (namespace, name).
    pub to_select: Vec<(String, String)>,
    /// An unbound `WaitForFirstConsumer` claim already has its node: wait for its binding.
    pub binding: bool,
}

impl PodVolumes {
    /// The Filter: `node` satisfies every bound volume's node affinity.
    ///
    /// # Errors
    /// [`Unfit::VolumeNodeAffinityConflict`] when it does not.
    pub fn admits(&self, node: &Node) -> Result<(), Unfit> {
        if self.bound.iter().all(|v| affinity_admits(v, node)) {
            Ok(())
        } else {
            Err(Unfit::VolumeNodeAffinityConflict)
        }
    }
}

fn affinity_admits(volume: &PersistentVolume, node: &Node) -> bool {
    let Some(required) = volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    let pod = Pod {
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            affinity: Some(k8s_openapi::api::core::v1::Affinity {
                node_affinity: Some(k8s_openapi::api::core::v1::NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(required.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.spec
        .as_ref()
        .is_some_and(|spec| crate::fit::node_selectors_match(spec, node))
}

/// The PreFilter (see the module docs): the pod's claims as the scheduler must treat them,
/// or kube-scheduler's reason the pod cannot be scheduled now.
///
/// # Errors
/// The reason, e.g. `persistentvolumeclaim "data" not found`.
pub fn pre_filter(pod: &Pod, seen: Volumes<'_>) -> Result<PodVolumes, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut out = PodVolumes::default();
    let claim_names = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str());
    let mut unbound_immediate = false;
    let mut missing_volume = false;
    for name in claim_names {
        let Some(claim) = seen.claims.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.metadata.name.as_deref() == Some(name)
        }) else {
            return Err(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty());
        if let Some(volume_name) = volume_name {
            match seen
                .volumes
                .iter()
                .find(|v| v.metadata.name.as_deref() == Some(volume_name))
            {
                Some(v) => out.bound.push(v.clone()),
                None => missing_volume = true,
            }
            continue;
        }
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .unwrap_or_default();
        let waits = seen
            .classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(class))
            .and_then(|c| c.volume_binding_mode.as_deref())
            == Some("WaitForFirstConsumer");
        if !waits {
            unbound_immediate = true;
        } else if claim
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SELECTED_NODE))
        {
            out.binding = true;
        } else {
            out.to_select.push((namespace.to_owned(), name.to_owned()));
        }
    }
    if unbound_immediate {
        return Err("pod has unbound immediate PersistentVolumeClaims".into());
    }
    if missing_volume {
        return Err("pvc(s) bound to non-existent pv(s)".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(claims: &[&str]) -> Pod {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}}))
        .expect("pod")
    }

    fn claim(name: &str, extra: serde_json::Value) -> Arc<PersistentVolumeClaim> {
        let mut c = json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"storageClassName": "local"}});
        if let (Some(c), serde_json::Value::Object(e)) = (c.as_object_mut(), extra) {
            for (k, v) in e {
                if let (Some(serde_json::Value::Object(inner)), serde_json::Value::Object(v)) =
                    (c.get_mut(&k), &v)
                {
                    inner.extend(v.clone());
                } else {
                    c.insert(k, v);
                }
            }
        }
        Arc::new(serde_json::from_value(c).expect("claim"))
    }

    fn classes() -> Vec<Arc<StorageClass>> {
        vec![
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "local"}, "provisioner": "p",
                "volumeBindingMode": "WaitForFirstConsumer"}))
                .expect("class"),
            ),
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "now"}, "provisioner": "p"}))
                    .expect("class"),
            ),
        ]
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
        )
        .expect("node")
    }

    #[test]
    fn a_missing_or_deleted_claim_or_an_unbound_immediate_one_keeps_the_pod_pending() {
        let classes = classes();
        let claims = [
            claim(
                "gone",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
            claim("now", json!({"spec": {"storageClassName": "now"}})),
        ];
        let seen = Volumes {
            claims: &claims,
            volumes: &[],
            classes: &classes,
        };
        let err = |claims: &[&str]| pre_filter(&pod(claims), seen).expect_err("unschedulable");
        assert_eq!(err(&["x"]), "persistentvolumeclaim \"x\" not found");
        assert_eq!(
            err(&["gone"]),
            "persistentvolumeclaim \"gone\" is being deleted"
        );
        assert_eq!(
            err(&["now"]),
            "pod has unbound immediate PersistentVolumeClaims"
        );
        assert!(pre_filter(&pod(&[]), seen).is_ok());
    }

    #[test]
    fn wait_for_first_consumer_claims_get_a_node_then_the_pod_waits_for_their_binding() {
        let classes = classes();
        let claims = [
            claim("new", json!({})),
            claim(
                "selected",
                json!({"metadata": {"annotations": {SELECTED_NODE: "n1"}}}),
            ),
        ];
        let seen = Volumes {
            claims: &claims,
            volumes: &[],
            classes: &classes,
        };
        let fresh = pre_filter(&pod(&["new"]), seen).expect("schedulable");
        assert_eq!(fresh.to_select, [("default".to_owned(), "new".to_owned())]);
        assert!(!fresh.binding);
        let waiting = pre_filter(&pod(&["selected"]), seen).expect("schedulable");
        assert!(waiting.to_select.is_empty());
        assert!(waiting.binding);
    }

    #[test]
    fn a_bound_volumes_node_affinity_filters_nodes() {
        let classes = classes();
        let claims = [claim("data", json!({"spec": {"volumeName": "pvc-1"}}))];
        let volumes = [Arc::new(
            serde_json::from_value::<PersistentVolume>(json!({"metadata": {"name": "pvc-1"},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}}))
            .expect("pv"),
        )];
        let seen = Volumes {
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
        };
        let v = pre_filter(&pod(&["data"]), seen).expect("schedulable");
        assert!(v.admits(&node("n1")).is_ok());
        assert_eq!(
            v.admits(&node("n2")).expect_err("conflict").to_string(),
            "node(s) had volume node affinity conflict"
        );
        let no_volume = Volumes {
            volumes: &[],
            ..seen
        };
        assert_eq!(
            pre_filter(&pod(&["data"]), no_volume).expect_err("missing"),
            "pvc(s) bound to non-existent pv(s)"
        );
    }
}
