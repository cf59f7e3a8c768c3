//! The controller runtime: everything the KubeVirt controllers share.
//!
//! - [`informer`]: watches one resource kind, keeps a cache and maps changes to queue keys;
//! - [`queue`]: the rate-limited, de-duplicating work queue;
//! - [`expectations`]: creations and deletions a controller is still waiting to observe;
//! - [`events`]: the event recorder (core `v1` Events, aggregated as client-go does);
//! - [`controller`]: workers that pull keys and call a reconciler;
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease;
//! - [`metrics`]: per-controller Prometheus metrics.
//!
//! Keys are `namespace/name` strings (just `name` for cluster-scoped objects), see [`key_of`].

pub mod controller;
pub use kubevirt_api::events;
pub mod expectations;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod queue;

use kube::Resource;
use kube::api::Patch;
use serde_json::Value;

/// Whether a failed patch failed only because the object changed since the cached copy it
/// was built from: a `resourceVersion` conflict or a failed JSON Patch `test`. The newer
/// object is then on its way through the watch, and its arrival reconciles again.
pub fn lost_race(e: &kube::core::Status) -> bool {
    e.code == 409 || (e.code == 422 && e.message.starts_with("testing value"))
}

/// A JSON Patch request from a list of operations (what every controller writes).
pub fn json_patch(ops: Vec<Value>) -> Result<Patch<()>, serde_json::Error> {
    serde_json::from_value::<json_patch::Patch>(Value::Array(ops)).map(Patch::Json)
}

/// The queue key of `obj`: `namespace/name`, or `name` when it has no namespace.
pub fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// Splits a key made by [`key_of`] into namespace (if any) and name.
pub fn split_key(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::ObjectMeta;

    #[test]
    fn namespaced_objects_are_keyed_by_namespace_and_name() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("vm-a".into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        assert_eq!(key_of(&cm), "default/vm-a");
        assert_eq!(split_key("default/vm-a"), (Some("default"), "vm-a"));
    }

    #[test]
    fn cluster_scoped_objects_are_keyed_by_name() {
        let node = Node {
            metadata: ObjectMeta {
                name: Some("node01".into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        assert_eq!(key_of(&node), "node01");
        assert_eq!(split_key("node01"), (None, "node01"));
    }
}
