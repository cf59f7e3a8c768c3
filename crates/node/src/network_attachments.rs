//! The API the node agent's secondary networks need ([`crate::pods::multus`]), as one installs
//! Multus on a cluster: the `network-attachment-definitions.k8s.cni.cncf.io` CRD (v1,
//! namespaced, `spec.config` a CNI configuration as a JSON string) and the rights Multus' own
//! service account has, here given to the nodes: read the definitions, patch the pods'
//! `network-status` annotation.
//!
//! The embedded server applies [`objects`] before KubeVirt; on a cluster Multus brings its own.

use serde_json::{Value, json};

use crate::pods::multus::{NAD_GROUP, NAD_KIND, NAD_PLURAL, NAD_VERSION};

/// The name of the ClusterRole (and its binding to the group `system:nodes`).
pub const ROLE_NAME: &str = "kubevirt-rs:node-multus";

/// The CRD, the ClusterRole and its binding, in the order to apply them.
pub fn objects() -> Vec<Value> {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{NAD_PLURAL}.{NAD_GROUP}")},
        "spec": {
            "group": NAD_GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": NAD_PLURAL,
                "singular": "network-attachment-definition",
                "kind": NAD_KIND,
                "shortNames": ["net-attach-def"],
            },
            "versions": [{
                "name": NAD_VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "description": "NetworkAttachmentDefinition is a CRD schema specified by the Network Plumbing Working Group to express the intent for attaching pods to one or more logical or physical networks.",
                    "type": "object",
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {
                            "description": "NetworkAttachmentDefinition spec defines the desired state of a network attachment",
                            "type": "object",
                            "properties": {
                                "config": {
                                    "description": "NetworkAttachmentDefinition config is a JSON-formatted CNI configuration",
                                    "type": "string",
                                },
                            },
                        },
                    },
                }},
            }],
        },
    });
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE_NAME},
        "rules": [
            {"apiGroups": [NAD_GROUP], "resources": [NAD_PLURAL], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        ],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": ROLE_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE_NAME},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    });
    vec![crd, role, binding]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_serves_v1_namespaced_with_a_string_config() {
        let objects = objects();
        let crd = &objects[0];
        assert_eq!(
            crd["metadata"]["name"],
            "network-attachment-definitions.k8s.cni.cncf.io"
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert_eq!(
            schema["properties"]["spec"]["properties"]["config"]["type"],
            "string"
        );
        assert_eq!(objects[2]["subjects"][0]["name"], "system:nodes");
    }
}
