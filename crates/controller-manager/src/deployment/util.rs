//! Pure helpers of the Deployment controller (kube's `deployment/util`): the template hash,
//! `maxSurge`/`maxUnavailable`, revisions and the annotations a Deployment puts on its
//! ReplicaSets, and which ReplicaSet is the new one.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

/// The label (and selector key) that ties a ReplicaSet and its pods to one template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The rollout sequence number of a ReplicaSet, copied to its Deployment.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// Earlier revisions a ReplicaSet served (after a rollback to it).
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// `spec.replicas` of the Deployment when it last scaled the ReplicaSet.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// `spec.replicas + maxSurge` of the Deployment when it last scaled the ReplicaSet.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// kubectl's record of the applied manifest: never copied to ReplicaSets.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// kube caps the revision history annotation at this many characters.
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

/// The characters kube's `rand.SafeEncodeString` maps to (no vowels, no look-alikes).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The pod-template hash: FNV-1a (32 bit) of the template's JSON and the collision count,
/// its decimal form safe-encoded as kube does (up to 10 characters, e.g. `5d8f7c9b4`).
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    feed(&serde_json::to_vec(&normalized(template)).unwrap_or_default());
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    hash.to_string()
        .bytes()
        .map(|b| char::from(SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()]))
        .collect()
}

/// A template as JSON without nulls, empty objects and empty lists, keys sorted, so a template
/// that went through the API server compares equal to the one it was made from and the hash
/// does not depend on the order of fields in the Rust types.
fn normalized(template: &PodTemplateSpec) -> Value {
    fn strip(v: Value) -> Option<Value> {
        match v {
            Value::Null => None,
            Value::Object(map) => {
                let sorted: BTreeMap<String, Value> = map
                    .into_iter()
                    .filter_map(|(k, v)| strip(v).map(|v| (k, v)))
                    .collect();
                let map: serde_json::Map<String, Value> = sorted.into_iter().collect();
                (!map.is_empty()).then_some(Value::Object(map))
            }
            Value::Array(list) => {
                let list: Vec<Value> = list.into_iter().filter_map(strip).collect();
                (!list.is_empty()).then_some(Value::Array(list))
            }
            other => Some(other),
        }
    }
    strip(serde_json::to_value(template).unwrap_or(Value::Null)).unwrap_or(Value::Null)
}

/// Whether two templates are equal once the `pod-template-hash` label is ignored.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let without = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.remove(POD_TEMPLATE_HASH);
        }
        normalized(&t)
    };
    without(a) == without(b)
}

/// `spec.replicas` with kube's default of 1.
pub fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// `spec.replicas` of a ReplicaSet (default 1).
pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// Whether the strategy is `Recreate` (otherwise `RollingUpdate`, the default).
pub fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

/// An int or a percentage of `total`; percentages round up or down as asked.
pub fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let Some(pct) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
                return s.parse().unwrap_or(0);
            };
            let product = pct * i64::from(total);
            let v = if round_up {
                (product + 99).div_euclid(100)
            } else {
                product.div_euclid(100)
            };
            i32::try_from(v).unwrap_or(i32::MAX)
        }
    }
}

/// `(maxSurge, maxUnavailable)` for `desired` replicas (kube's `ResolveFenceposts`): surge
/// rounds up, unavailable rounds down, both default to 25%, and both zero means one
/// unavailable.
pub fn fenceposts(d: &Deployment, desired: i32) -> (i32, i32) {
    let rolling = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let quarter = IntOrString::String("25%".into());
    let surge = rolling
        .and_then(|r| r.max_surge.as_ref())
        .unwrap_or(&quarter);
    let unavailable = rolling
        .and_then(|r| r.max_unavailable.as_ref())
        .unwrap_or(&quarter);
    let surge = scaled_value(surge, desired, true);
    let unavailable = scaled_value(unavailable, desired, false);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// How many pods above `replicas` a rolling update may run (0 for Recreate).
pub fn max_surge(d: &Deployment) -> i32 {
    if is_recreate(d) {
        return 0;
    }
    fenceposts(d, replicas(d)).0
}

/// How many of `replicas` may be unavailable during a rolling update (0 for Recreate or no
/// replicas; never more than `replicas`).
pub fn max_unavailable(d: &Deployment) -> i32 {
    let desired = replicas(d);
    if is_recreate(d) || desired == 0 {
        return 0;
    }
    fenceposts(d, desired).1.min(desired)
}

/// The revision of a ReplicaSet (0 without the annotation).
pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(rs, REVISION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn annotation<'a>(rs: &'a ReplicaSet, key: &str) -> Option<&'a str> {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The `desired-replicas` annotation of a ReplicaSet, if set.
pub fn desired_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    annotation(rs, DESIRED_REPLICAS).and_then(|v| v.parse().ok())
}

/// The `max-replicas` annotation of a ReplicaSet, if set.
pub fn max_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    annotation(rs, MAX_REPLICAS).and_then(|v| v.parse().ok())
}

/// Sets the `desired-replicas` and `max-replicas` annotations; returns whether they changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (key, value) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let value = value.to_string();
        if annotations.get(key) != Some(&value) {
            annotations.insert(key.to_owned(), value);
            changed = true;
        }
    }
    changed
}

fn skip_copy(key: &str) -> bool {
    matches!(
        key,
        LAST_APPLIED | REVISION | REVISION_HISTORY | DESIRED_REPLICAS | MAX_REPLICAS
    )
}

/// Copies the Deployment's annotations to its new ReplicaSet and raises the ReplicaSet's
/// revision to `new_revision` (keeping the old one in the revision history); a ReplicaSet
/// about to be created also gets its replica annotations. Returns whether anything changed.
pub fn set_new_rs_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
) -> bool {
    let mut changed = false;
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if skip_copy(k) || annotations.get(k) == Some(v) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
        changed = true;
    }
    let old = annotations.get(REVISION).cloned();
    let old_number = old
        .as_deref()
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    if old_number < new_revision {
        annotations.insert(REVISION.to_owned(), new_revision.to_string());
        changed = true;
        if let Some(old) = old.filter(|o| !o.is_empty()) {
            let history = match annotations.get(REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{old}"),
                _ => old,
            };
            let mut history = history.as_str();
            while history.len() > MAX_REVISION_HISTORY_CHARS {
                history = history.split_once(',').map_or("", |(_, rest)| rest);
            }
            annotations.insert(REVISION_HISTORY.to_owned(), history.to_owned());
        }
    }
    if !exists {
        let desired = replicas(d);
        changed |= set_replicas_annotations(rs, desired, desired + max_surge(d));
    }
    changed
}

/// The ReplicaSet whose template is the Deployment's (the oldest such, as kube picks).
pub fn find_new(d: &Deployment, rss: &[ReplicaSet]) -> Option<usize> {
    let template = d
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let mut matching: Vec<usize> = (0..rss.len())
        .filter(|&i| {
            rss[i]
                .spec
                .as_ref()
                .and_then(|s| s.template.as_ref())
                .is_some_and(|t| equal_ignore_hash(t, &template))
        })
        .collect();
    matching.sort_by(|&a, &b| by_creation(&rss[a], &rss[b]));
    matching.first().copied()
}

/// Oldest first; ties by name.
pub fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> std::cmp::Ordering {
    let t = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    t(a).cmp(&t(b))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[allow(clippy::needless_pass_by_value)] // test fixtures read best with owned JSON
    fn deployment(strategy: Value, replicas: i32) -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "d"}, "spec": {"replicas": replicas,
            "selector": {"matchLabels": {"app": "a"}}, "strategy": strategy,
            "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .expect("deployment")
    }

    #[test]
    fn surge_rounds_up_and_unavailable_rounds_down() {
        let d = deployment(json!({"type": "RollingUpdate"}), 10);
        assert_eq!((max_surge(&d), max_unavailable(&d)), (3, 2));
        let d = deployment(
            json!({"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": "10%"}}),
            3,
        );
        assert_eq!((max_surge(&d), max_unavailable(&d)), (1, 0));
    }

    #[test]
    fn zero_surge_and_zero_unavailable_allow_one_unavailable() {
        let d = deployment(
            json!({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}),
            2,
        );
        assert_eq!((max_surge(&d), max_unavailable(&d)), (0, 1));
    }

    #[test]
    fn recreate_has_no_surge_and_no_unavailable_budget() {
        let d = deployment(json!({"type": "Recreate"}), 4);
        assert_eq!((max_surge(&d), max_unavailable(&d)), (0, 0));
    }

    #[test]
    fn the_hash_is_stable_short_and_changes_with_the_template_or_collisions() {
        let d = deployment(json!({}), 1);
        let t = d.spec.clone().expect("spec").template;
        let h = compute_hash(&t, None);
        assert_eq!(h, compute_hash(&t, None));
        assert!((1..=10).contains(&h.len()));
        assert!(h.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
        assert_ne!(h, compute_hash(&t, Some(1)));
        let mut other = t.clone();
        other.metadata = Some(Default::default());
        assert_ne!(h, compute_hash(&other, None));
    }

    #[test]
    fn the_hash_of_a_known_template_never_changes() {
        // A changed hash would roll every Deployment and DaemonSet after an upgrade.
        let d = deployment(json!({}), 1);
        let t = d.spec.clone().expect("spec").template;
        assert_eq!(compute_hash(&t, None), "57b67cdf4b");
    }

    #[test]
    fn templates_equal_apart_from_the_hash_label() {
        let d = deployment(json!({}), 1);
        let t = d.spec.clone().expect("spec").template;
        let mut labelled = t.clone();
        if let Some(l) = labelled.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            l.insert(POD_TEMPLATE_HASH.into(), "abc".into());
        }
        assert!(equal_ignore_hash(&t, &labelled));
    }

    #[test]
    fn a_new_revision_keeps_the_old_one_in_the_history() {
        let d = deployment(json!({}), 1);
        let mut rs: ReplicaSet = serde_json::from_value(
            json!({"metadata": {"name": "d-1", "annotations": {REVISION: "1"}}}),
        )
        .expect("rs");
        assert!(set_new_rs_annotations(&d, &mut rs, 3, true));
        let a = rs.metadata.annotations.expect("annotations");
        assert_eq!(a.get(REVISION).map(String::as_str), Some("3"));
        assert_eq!(a.get(REVISION_HISTORY).map(String::as_str), Some("1"));
    }
}
