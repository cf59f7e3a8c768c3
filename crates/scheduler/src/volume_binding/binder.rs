//! Pure matching of claims and volumes, as kube's PV binder (`pkg/controller/volume/
//! persistentvolume`, `FindMatchingVolume`) decides it: which PersistentVolume satisfies a
//! PersistentVolumeClaim. Shared by the scheduler's volume filter and the controller-manager's
//! PV controller, as kube shares it between the two.
//!
//! A volume matches a claim when it is not being deleted, is not bound to another claim
//! (a `claimRef` naming this claim — by name and namespace, and by uid when the ref has one
//! — pre-binds it), has the claim's `storageClassName` (no class matches no class),
//! the claim's `volumeMode` (`Filesystem` when unset on either), every access mode the claim
//! asks for, at least the claim's `resources.requests.storage`, and, when a node is given
//! (a `WaitForFirstConsumer` claim with its selected node), a node affinity that node
//! satisfies. A claim with a `selector` or a `volumeName` is matched only by volumes it
//! names; among the matches a pre-bound volume wins, then the smallest.

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_quantity::Quantity as ExactQuantity;

/// Thousandths of a quantity; `None` when it does not parse.
fn milli(q: &Quantity) -> Option<i128> {
    ExactQuantity::try_from(q).ok().map(|q| q.milli_value())
}

/// The storage a claim requests (thousandths of a byte); `None` when unset or malformed.
pub fn requested_storage(claim: &PersistentVolumeClaim) -> Option<i128> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .and_then(milli)
}

/// The storage a volume holds (thousandths of a byte); `None` when unset or malformed.
pub fn volume_capacity(volume: &PersistentVolume) -> Option<i128> {
    volume
        .spec
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .and_then(milli)
}

/// The claim's class: `None` and `""` both mean no class.
pub fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

fn volume_class(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// The claim's `volumeMode`, `Filesystem` when unset.
pub fn claim_mode(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem")
}

fn volume_mode(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem")
}

/// Whether the volume's `claimRef` names `claim` (its uid too, when the ref carries one).
pub fn is_bound_to(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(r) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.name == claim.metadata.name
        && r.namespace == claim.metadata.namespace
        && r.uid
            .as_deref()
            .is_none_or(|uid| Some(uid) == claim.metadata.uid.as_deref())
}

fn is_available(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    volume.metadata.deletion_timestamp.is_none()
        && (volume.spec.as_ref().is_none_or(|s| s.claim_ref.is_none())
            || is_bound_to(volume, claim))
        && !matches!(
            volume.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Released" | "Failed")
        )
}

fn modes_cover(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let have = volume
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default()
        .iter()
        .all(|m| have.contains(m))
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether the volume's required node affinity admits a node with these labels (no
/// affinity admits every node).
pub fn node_affinity_admits(volume: &PersistentVolume, node: &Node) -> bool {
    let Some(required) = volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        !exprs.is_empty()
            && exprs
                .iter()
                .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
    })
}

/// Whether `volume` satisfies `claim` (see the module docs); `node` is the node a
/// `WaitForFirstConsumer` claim was given.
pub fn matches(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> bool {
    let spec = claim.spec.as_ref();
    let named = spec
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty());
    if named.is_some_and(|n| volume.metadata.name.as_deref() != Some(n)) {
        return false;
    }
    // Label selectors of claims are not evaluated: such a claim binds only what it names or
    // what names it.
    if spec.and_then(|s| s.selector.as_ref()).is_some()
        && named.is_none()
        && !is_bound_to(volume, claim)
    {
        return false;
    }
    let enough = match (volume_capacity(volume), requested_storage(claim)) {
        (Some(have), Some(want)) => have >= want,
        _ => false,
    };
    is_available(volume, claim)
        && volume_class(volume) == claim_class(claim)
        && volume_mode(volume) == claim_mode(claim)
        && modes_cover(volume, claim)
        && enough
        && node.is_none_or(|n| node_affinity_admits(volume, n))
}

/// The volume `claim` should bind to among `volumes`: a matching pre-bound one, else the
/// smallest match (ties: name order).
pub fn find_match<'a>(
    volumes: &'a [std::sync::Arc<PersistentVolume>],
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> Option<&'a PersistentVolume> {
    let candidates = volumes.iter().filter(|v| matches(v, claim, node));
    candidates
        .min_by_key(|v| {
            (
                !is_bound_to(v, claim),
                volume_capacity(v).unwrap_or(i128::MAX),
                v.metadata.name.clone(),
            )
        })
        .map(AsRef::as_ref)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use serde_json::json;

    fn claim(extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut base = json!({
            "metadata": {"name": "data", "namespace": "default", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                "resources": {"requests": {"storage": "1Gi"}}}
        });
        merge(&mut base, extra);
        serde_json::from_value(base).expect("claim")
    }

    fn volume(name: &str, extra: serde_json::Value) -> Arc<PersistentVolume> {
        let mut base = json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce", "ReadWriteMany"], "storageClassName": "local",
                "capacity": {"storage": "2Gi"}, "hostPath": {"path": "/x"}}
        });
        merge(&mut base, extra);
        Arc::new(serde_json::from_value(base).expect("volume"))
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

    fn names(found: Option<&PersistentVolume>) -> Option<&str> {
        found.and_then(|v| v.metadata.name.as_deref())
    }

    #[test]
    fn the_smallest_volume_of_the_class_with_the_modes_and_the_size_binds() {
        let volumes = [
            volume("big", json!({"spec": {"capacity": {"storage": "10Gi"}}})),
            volume(
                "small",
                json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}}),
            ),
            volume(
                "too-small",
                json!({"spec": {"capacity": {"storage": "512Mi"}}}),
            ),
            volume("other-class", json!({"spec": {"storageClassName": "fast"}})),
            volume(
                "read-only",
                json!({"spec": {"accessModes": ["ReadOnlyMany"]}}),
            ),
            volume("block", json!({"spec": {"volumeMode": "Block"}})),
        ];
        assert_eq!(
            names(find_match(&volumes, &claim(json!({})), None)),
            Some("small")
        );
        let many = claim(json!({"spec": {"accessModes": ["ReadWriteMany"]}}));
        assert_eq!(names(find_match(&volumes, &many, None)), Some("big"));
        let block = claim(json!({"spec": {"volumeMode": "Block"}}));
        assert_eq!(names(find_match(&volumes, &block, None)), Some("block"));
        let huge = claim(json!({"spec": {"resources": {"requests": {"storage": "1Ti"}}}}));
        assert_eq!(names(find_match(&volumes, &huge, None)), None);
    }

    #[test]
    fn volumes_bound_elsewhere_or_released_never_match_and_a_pre_bound_one_wins() {
        let mine = json!({"spec": {"claimRef": {"name": "data", "namespace": "default", "uid": "u1"},
            "capacity": {"storage": "5Gi"}}});
        let volumes = [
            volume(
                "taken",
                json!({"spec": {"claimRef": {"name": "other", "namespace": "default"}}}),
            ),
            volume(
                "old-uid",
                json!({"spec": {"claimRef": {"name": "data", "namespace": "default", "uid": "u0"}}}),
            ),
            volume("released", json!({"status": {"phase": "Released"}})),
            volume("free", json!({})),
            volume("mine", mine),
        ];
        assert_eq!(
            names(find_match(&volumes, &claim(json!({})), None)),
            Some("mine")
        );
        assert_eq!(
            names(find_match(&volumes[..4], &claim(json!({})), None)),
            Some("free")
        );
        assert_eq!(
            names(find_match(&volumes[..3], &claim(json!({})), None)),
            None
        );
    }

    #[test]
    fn no_class_matches_only_no_class_and_a_named_volume_only_itself() {
        let volumes = [
            volume("classless", json!({"spec": {"storageClassName": null}})),
            volume("local", json!({})),
        ];
        let none = claim(json!({"spec": {"storageClassName": ""}}));
        assert_eq!(names(find_match(&volumes, &none, None)), Some("classless"));
        let named = claim(json!({"spec": {"volumeName": "local"}}));
        assert_eq!(names(find_match(&volumes, &named, None)), Some("local"));
        let missing = claim(json!({"spec": {"volumeName": "gone"}}));
        assert_eq!(names(find_match(&volumes, &missing, None)), None);
        let selector = claim(json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}));
        assert_eq!(names(find_match(&volumes, &selector, None)), None);
    }

    #[test]
    fn a_selected_node_must_satisfy_the_volumes_node_affinity() {
        let pinned = |node: &str| {
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})
        };
        let volumes = [volume("on-a", pinned("a")), volume("on-b", pinned("b"))];
        let node = |name: &str| -> Node {
            serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
            )
            .expect("node")
        };
        let c = claim(json!({}));
        assert_eq!(
            names(find_match(&volumes, &c, Some(&node("b")))),
            Some("on-b")
        );
        assert_eq!(names(find_match(&volumes, &c, Some(&node("c")))), None);
        assert_eq!(names(find_match(&volumes, &c, None)), Some("on-a"));
    }
}
