//! Shared object metadata: upstream's label keys and small builders.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// `kubevirt.io`: the component label (empty on shared objects).
pub const APP_LABEL: &str = "kubevirt.io";
/// `app.kubernetes.io/name`.
pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/managed-by`.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on objects virt-operator owns.
pub const MANAGED_BY_OPERATOR: &str = "virt-operator";
/// `prometheus.kubevirt.io`: pods scraped through `kubevirt-prometheus-metrics`.
pub const PROMETHEUS_LABEL: &str = "prometheus.kubevirt.io";
/// `np.kubevirt.io/allow-access-cluster-services`.
pub const ALLOW_ACCESS_CLUSTER_SERVICES_LABEL: &str =
    "np.kubevirt.io/allow-access-cluster-services";
/// The PriorityClass of KubeVirt's own pods.
pub const PRIORITY_CLASS: &str = "kubevirt-cluster-critical";

/// A label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Cluster-scoped metadata: a name and labels.
pub fn cluster_meta(name: &str, label_pairs: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: (!label_pairs.is_empty()).then(|| labels(label_pairs)),
        ..ObjectMeta::default()
    }
}

/// Namespaced metadata: a name, namespace and labels.
pub fn namespaced_meta(namespace: &str, name: &str, label_pairs: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.to_owned()),
        ..cluster_meta(name, label_pairs)
    }
}

/// `Kind namespace/name` of a JSON object, for messages.
pub fn describe(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("object");
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// `strings` as owned strings.
pub fn strings(strings: &[&str]) -> Vec<String> {
    strings.iter().map(|s| (*s).to_owned()).collect()
}
