//! kube-scheduler's `VolumeBinding` plugin, for one machine: what a pod's
//! `persistentVolumeClaim` volumes say about where and when it can be bound.
//!
//! - PreFilter ([`pre_filter`]): every claim must exist and not be being deleted
//!   (`persistentvolumeclaim "x" not found`, `… is being deleted`); an unbound claim of an
//!   `Immediate` class (or of no class) makes the pod wait for the PV controller (`pod has
//!   unbound immediate PersistentVolumeClaims`); a bound claim's volume must exist.
//! - Filter ([`PodVolumes::admits`]): a node must satisfy the node affinity of every bound
//!   volume (`node(s) had volume node affinity conflict`), and each unbound
//!   `WaitForFirstConsumer` claim must have a matching available volume there ([`binder`])
//!   unless its class provisions (`node(s) didn't find available persistent volumes to
//!   bind`).
//! - Reserve / PreBind: unbound claims of a `WaitForFirstConsumer` class get the chosen node
//!   as [`SELECTED_NODE`]; the pod is bound only once all its claims are `Bound` (the
//!   provisioned volume's affinity then pins the pod to the selected node).
//!
//! # Caveats
//! - Storage capacity and `allowedTopologies` are not considered: a class with a provisioner
//!   is assumed to provision on every node; the PV controller binds a matching volume on the
//!   chosen node if there is one, else provisions.
//! - Two claims of one pod may be counted on the same pre-created volume.
//! - A pod waiting for its claims holds no resources of the node it was given.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::fit::Unfit;

/// The annotation naming the node of a `WaitForFirstConsumer` claim.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The provisioner of classes whose volumes are all created in advance.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

pub mod binder;

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
    /// Those of them whose class does not provision: they need a pre-created volume.
    pub need_volume: Vec<Arc<PersistentVolumeClaim>>,
    /// The volumes the scheduler sees (for [`PodVolumes::admits`]).
    pub volumes: Vec<Arc<PersistentVolume>>,
    /// An unbound `WaitForFirstConsumer` claim already has its node: wait for its binding.
    pub binding: bool,
}

impl PodVolumes {
    /// The Filter: `node` satisfies every bound volume's node affinity.
    ///
    /// # Errors
    /// [`Unfit::VolumeNodeAffinityConflict`] when it does not.
    pub fn admits(&self, node: &Node) -> Result<(), Unfit> {
        if !self
            .bound
            .iter()
            .all(|v| binder::node_affinity_admits(v, node))
        {
            return Err(Unfit::VolumeNodeAffinityConflict);
        }
        if !self
            .need_volume
            .iter()
            .all(|c| binder::find_match(&self.volumes, c, Some(node)).is_some())
        {
            return Err(Unfit::NoVolumeToBind);
        }
        Ok(())
    }
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
        let class = seen
            .classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(class));
        let waits =
            class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
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
            if class.is_some_and(|c| c.provisioner == NO_PROVISIONER) {
                out.need_volume.push(claim.clone());
            }
        }
    }
    if unbound_immediate {
        return Err("pod has unbound immediate PersistentVolumeClaims".into());
    }
    if missing_volume {
        return Err("pvc(s) bound to non-existent pv(s)".into());
    }
    if !out.need_volume.is_empty() {
        out.volumes = seen.volumes.to_vec();
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

    #[test]
    fn a_claim_of_a_class_without_provisioner_needs_a_volume_on_the_node() {
        let classes = [Arc::new(
            serde_json::from_value::<StorageClass>(json!({"metadata": {"name": "local"},
                "provisioner": NO_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"}))
            .expect("class"),
        )];
        let claims = [claim(
            "data",
            json!({"spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}),
        )];
        let volumes = [Arc::new(
            serde_json::from_value::<PersistentVolume>(json!({"metadata": {"name": "on-n2"},
                "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": "10Gi"}, "local": {"path": "/mnt/disk"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}}}}))
            .expect("pv"),
        )];
        let seen = Volumes {
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
        };
        let v = pre_filter(&pod(&["data"]), seen).expect("schedulable");
        assert!(v.admits(&node("n2")).is_ok());
        assert_eq!(
            v.admits(&node("n1")).expect_err("no volume").to_string(),
            "node(s) didn't find available persistent volumes to bind"
        );
    }
}
