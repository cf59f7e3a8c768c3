//! The `MutatingWebhookConfiguration` `virt-api-mutator` and `ValidatingWebhookConfiguration`
//! `virt-api-validator` that register the webhooks, as upstream's operator creates them.

use base64::Engine;
use serde_json::{Value, json};

use super::review::paths;

/// Name of the mutating configuration.
pub const MUTATOR_NAME: &str = "virt-api-mutator";
/// Name of the validating configuration.
pub const VALIDATOR_NAME: &str = "virt-api-validator";
const TIMEOUT_SECONDS: i32 = 10;

/// How the API server reaches virt-api.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A URL base (embedded mode), e.g. `https://127.0.0.1:8443`; the path is appended.
    Url(String),
    /// A Service (cluster mode): namespace, name and port.
    Service {
        /// Namespace of the service (`kubevirt`).
        namespace: String,
        /// Service name (`virt-api`).
        name: String,
        /// Service port (443).
        port: i32,
    },
}

impl WebhookTarget {
    fn client_config(&self, ca_bundle: &str, path: &str) -> Value {
        match self {
            Self::Url(base) => {
                json!({"url": format!("{}{path}", base.trim_end_matches('/')), "caBundle": ca_bundle})
            }
            Self::Service {
                namespace,
                name,
                port,
            } => json!({
                "service": {"namespace": namespace, "name": name, "path": path, "port": port},
                "caBundle": ca_bundle,
            }),
        }
    }
}

/// One rule of a webhook: operations on a resource of a group.
struct Rule<'a>(&'a [&'a str], &'a str, &'a [&'a str], &'a str);

fn hook(
    name: &str,
    path: &str,
    Rule(ops, group, versions, resource): Rule<'_>,
    target: &WebhookTarget,
    ca: &str,
) -> Value {
    json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "rules": [{"operations": ops, "apiGroups": [group], "apiVersions": versions, "resources": [resource]}],
        "clientConfig": target.client_config(ca, path),
    })
}

/// A `pods/eviction` interceptor for pods whose name starts with `prefix` (upstream's
/// `matchConditions`; an API server that does not evaluate them calls the hook for every
/// eviction, which the admitter allows for other pods).
fn eviction_hook(name: &str, prefix: &str, target: &WebhookTarget, ca: &str) -> Value {
    let mut hook = hook(
        name,
        paths::POD_EVICTION_VALIDATE,
        Rule(&["*"], "", &["v1"], "pods/eviction"),
        target,
        ca,
    );
    hook["sideEffects"] = json!("NoneOnDryRun");
    hook["matchConditions"] = json!([{
        "name": if prefix == "virt-launcher" { "only-vms" } else { "only-hotplug-pods" },
        "expression": format!("object.metadata.name.startsWith(\"{prefix}\")"),
    }]);
    hook
}

fn meta(name: &str) -> Value {
    json!({"name": name, "labels": {"kubevirt.io": name, "app.kubernetes.io/managed-by": "virt-operator"}})
}

/// The mutating and validating configurations for `target`, trusting `ca_bundle_pem`.
#[must_use]
pub fn webhook_configurations_for(ca_bundle_pem: &[u8], target: &WebhookTarget) -> (Value, Value) {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_bundle_pem);
    let core = ["v1alpha3", "v1"];
    let g = "kubevirt.io";
    let (cu, c) = (["CREATE", "UPDATE"].as_slice(), ["CREATE"].as_slice());
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": meta(MUTATOR_NAME),
        "webhooks": [
            hook("virtualmachines-mutator.kubevirt.io", paths::VM_MUTATE, Rule(cu, g, &core, "virtualmachines"), target, &ca),
            hook("virtualmachineinstances-mutator.kubevirt.io", paths::VMI_MUTATE, Rule(cu, g, &core, "virtualmachineinstances"), target, &ca),
            hook("migrations-mutator.kubevirt.io", paths::MIGRATION_MUTATE, Rule(c, g, &core, "virtualmachineinstancemigrations"), target, &ca),
        ],
    });
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": meta(VALIDATOR_NAME),
        "webhooks": [
            hook("virtualmachineinstances-create-validator.kubevirt.io", paths::VMI_VALIDATE_CREATE, Rule(c, g, &core, "virtualmachineinstances"), target, &ca),
            hook("virtualmachineinstances-update-validator.kubevirt.io", paths::VMI_VALIDATE_UPDATE, Rule(&["UPDATE"], g, &core, "virtualmachineinstances"), target, &ca),
            hook("virtualmachine-validator.kubevirt.io", paths::VM_VALIDATE, Rule(cu, g, &core, "virtualmachines"), target, &ca),
            hook("virtualmachinereplicaset-validator.kubevirt.io", paths::VMIRS_VALIDATE, Rule(cu, g, &core, "virtualmachineinstancereplicasets"), target, &ca),
            hook("virtualmachinepool-validator.kubevirt.io", paths::POOL_VALIDATE, Rule(cu, "pool.kubevirt.io", &["v1beta1"], "virtualmachinepools"), target, &ca),
            hook("migration-create-validator.kubevirt.io", paths::MIGRATION_VALIDATE_CREATE, Rule(c, g, &core, "virtualmachineinstancemigrations"), target, &ca),
            hook("migration-update-validator.kubevirt.io", paths::MIGRATION_VALIDATE_UPDATE, Rule(&["UPDATE"], g, &core, "virtualmachineinstancemigrations"), target, &ca),
            eviction_hook("virt-launcher-eviction-interceptor.kubevirt.io", "virt-launcher", target, &ca),
            eviction_hook("hotplug-pod-eviction-interceptor.kubevirt.io", "hp-volume-", target, &ca),
        ],
    });
    (mutating, validating)
}

/// The configurations for an embedded server reachable at `service_url_base`
/// (e.g. `https://127.0.0.1:8443`).
#[must_use]
pub fn webhook_configurations(ca_bundle_pem: &[u8], service_url_base: &str) -> (Value, Value) {
    webhook_configurations_for(
        ca_bundle_pem,
        &WebhookTarget::Url(service_url_base.to_owned()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_configurations_point_every_hook_at_the_url_base_with_fail_policy() {
        let (m, v) = webhook_configurations(b"PEM", "https://127.0.0.1:8443/");
        assert_eq!(m["metadata"]["name"], MUTATOR_NAME);
        assert_eq!(v["metadata"]["name"], VALIDATOR_NAME);
        assert_eq!(
            m["webhooks"][1]["clientConfig"]["url"],
            "https://127.0.0.1:8443/virtualmachineinstances-mutate"
        );
        for hook in m["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .chain(v["webhooks"].as_array().unwrap())
        {
            assert_eq!(hook["failurePolicy"], "Fail");
            // The eviction interceptors patch the VMI, except on dry runs (as upstream).
            let side_effects = if hook["rules"][0]["resources"][0] == "pods/eviction" {
                "NoneOnDryRun"
            } else {
                "None"
            };
            assert_eq!(hook["sideEffects"], side_effects);
            assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
            assert_eq!(hook["clientConfig"]["caBundle"], "UEVN");
        }
        assert_eq!(v["webhooks"].as_array().unwrap().len(), 9);
        let launcher = &v["webhooks"][7];
        assert_eq!(
            launcher["name"],
            "virt-launcher-eviction-interceptor.kubevirt.io"
        );
        assert_eq!(
            launcher["clientConfig"]["url"],
            "https://127.0.0.1:8443/pod-eviction-validate"
        );
        assert_eq!(
            launcher["rules"],
            json!([{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/eviction"]}])
        );
        assert_eq!(
            launcher["matchConditions"][0]["expression"],
            "object.metadata.name.startsWith(\"virt-launcher\")"
        );
    }

    #[test]
    fn cluster_configurations_use_the_service_reference() {
        let target = WebhookTarget::Service {
            namespace: "kubevirt".into(),
            name: "virt-api".into(),
            port: 443,
        };
        let (_, v) = webhook_configurations_for(b"x", &target);
        assert_eq!(
            v["webhooks"][0]["clientConfig"]["service"]["path"],
            "/virtualmachineinstances-validate-create"
        );
        assert!(v["webhooks"][0]["clientConfig"].get("url").is_none());
    }
}
