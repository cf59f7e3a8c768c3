//! CustomResourceDefinition generation.
//!
//! [`all_crds`] builds the CRDs of every kind from the Rust types (`kube` derive), then makes
//! them match upstream where the derive cannot express it:
//! - every schema is made structural ([`schema::structuralize`]); quantities get upstream's
//!   `pattern`, and the long k8s-openapi descriptions of Quantity, IntOrString and Time are dropped;
//! - the VirtualMachineInstance CRD has **no** status subresource, as upstream: the VMI status is
//!   written together with the object;
//! - core kinds also serve the deprecated `v1alpha3` (same schema, not stored) and pools the
//!   `v1alpha1` version, so manifests using those versions keep working.
//!
//! [`all_crds_yaml`] prints them as one multi-document YAML stream (`kubevirt-rs crds`).

pub mod schema;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, CustomResourceValidation,
    JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::migrations::v1alpha1::MigrationPolicy;
use crate::pool::v1beta1::VirtualMachinePool;
use crate::v1::{
    KubeVirt, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceReplicaSet,
};

/// Deprecation warning of the `v1alpha3` version of the core kinds.
pub const V1ALPHA3_DEPRECATION_WARNING: &str =
    "kubevirt.io/v1alpha3 is now deprecated and will be removed in a future release.";

/// Error of CRD generation.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A generated schema could not be converted between JSON and the k8s-openapi type.
    #[error("converting the schema of {crd}")]
    Schema {
        /// Name of the CRD.
        crd: String,
        /// The conversion error.
        #[source]
        source: serde_json::Error,
    },
    /// A CRD could not be encoded as YAML.
    #[error("encoding {crd} as YAML")]
    Yaml {
        /// Name of the CRD.
        crd: String,
        /// The encoding error.
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// The CRDs of every kind: VirtualMachineInstance, VirtualMachine,
/// VirtualMachineInstanceMigration, VirtualMachineInstanceReplicaSet, KubeVirt,
/// VirtualMachinePool and MigrationPolicy, in that order.
///
/// # Errors
///
/// [`CrdError::Schema`] if a schema cannot be converted (a bug in the types).
pub fn all_crds() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    let mut vmi = VirtualMachineInstance::crd();
    for version in &mut vmi.spec.versions {
        version.subresources = None;
    }
    let core = [
        vmi,
        VirtualMachine::crd(),
        VirtualMachineInstanceMigration::crd(),
        VirtualMachineInstanceReplicaSet::crd(),
        KubeVirt::crd(),
    ];
    let mut out = Vec::with_capacity(core.len() + 1);
    for mut crd in core {
        finish(&mut crd)?;
        add_deprecated_version(&mut crd, "v1alpha3", Some(V1ALPHA3_DEPRECATION_WARNING));
        out.push(crd);
    }
    let mut pool = VirtualMachinePool::crd();
    finish(&mut pool)?;
    add_deprecated_version(&mut pool, "v1alpha1", None);
    out.push(pool);
    let mut policy = MigrationPolicy::crd();
    finish(&mut policy)?;
    out.push(policy);
    Ok(out)
}

/// Makes every version's schema structural.
fn finish(crd: &mut CustomResourceDefinition) -> Result<(), CrdError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    for version in &mut crd.spec.versions {
        let Some(props) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.take())
        else {
            continue;
        };
        let to_err = |source| CrdError::Schema {
            crd: name.clone(),
            source,
        };
        let mut value = serde_json::to_value(props).map_err(to_err)?;
        schema::structuralize(&mut value);
        schema::tidy_k8s_descriptions(&mut value);
        let props: JSONSchemaProps = serde_json::from_value(value).map_err(to_err)?;
        version.schema = Some(CustomResourceValidation {
            open_api_v3_schema: Some(props),
        });
    }
    Ok(())
}

/// Appends an older version served with the same schema, not stored. Upstream marks the core
/// `v1alpha3` deprecated; the pool `v1alpha1` is served without deprecation.
fn add_deprecated_version(crd: &mut CustomResourceDefinition, name: &str, warning: Option<&str>) {
    let Some(first) = crd.spec.versions.first() else {
        return;
    };
    let old = CustomResourceDefinitionVersion {
        name: name.to_owned(),
        served: true,
        storage: false,
        deprecated: warning.map(|_| true),
        deprecation_warning: warning.map(str::to_owned),
        ..first.clone()
    };
    crd.spec.versions.push(old);
}

/// All CRDs as a multi-document YAML stream, each document starting with `---`.
///
/// # Errors
///
/// [`CrdError`] if a CRD cannot be built or encoded.
pub fn all_crds_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in all_crds()? {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let yaml =
            serde_saphyr::to_string(&crd).map_err(|source| CrdError::Yaml { crd: name, source })?;
        out.push_str("---\n");
        out.push_str(&yaml);
        if !yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn crds() -> &'static [CustomResourceDefinition] {
        static CRDS: std::sync::OnceLock<Vec<CustomResourceDefinition>> =
            std::sync::OnceLock::new();
        CRDS.get_or_init(|| all_crds().unwrap())
    }

    fn crd(name: &str) -> CustomResourceDefinition {
        crds()
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .cloned()
            .unwrap_or_else(|| panic!("no CRD {name}"))
    }

    fn schema(name: &str) -> Value {
        let crd = crd(name);
        serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap()
    }

    fn at<'a>(schema: &'a Value, path: &[&str]) -> &'a Value {
        path.iter().fold(schema, |node, key| {
            let next = if *key == "[]" {
                &node["items"]
            } else {
                &node["properties"][*key]
            };
            assert!(!next.is_null(), "missing {key} in {path:?}");
            next
        })
    }

    #[test]
    fn every_schema_of_every_crd_is_structural() {
        for crd in crds() {
            for version in &crd.spec.versions {
                let props = version.schema.as_ref().unwrap().open_api_v3_schema.as_ref();
                let value = serde_json::to_value(props.unwrap()).unwrap();
                let violations = schema::structural_violations(&value);
                assert!(
                    violations.is_empty(),
                    "{} {}: {violations:#?}",
                    crd.metadata.name.as_deref().unwrap_or_default(),
                    version.name
                );
            }
        }
    }

    #[test]
    fn yaml_stream_decodes_back_into_the_same_crds() {
        let yaml = all_crds_yaml().unwrap();
        assert!(yaml.starts_with("---\n"));
        let decoded: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(decoded, crds());
        let names: Vec<_> = decoded
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "virtualmachineinstances.kubevirt.io",
                "virtualmachines.kubevirt.io",
                "virtualmachineinstancemigrations.kubevirt.io",
                "virtualmachineinstancereplicasets.kubevirt.io",
                "kubevirts.kubevirt.io",
                "virtualmachinepools.pool.kubevirt.io",
                "migrationpolicies.migrations.kubevirt.io",
            ]
        );
    }

    #[test]
    fn names_short_names_and_categories_match_upstream() {
        let cases = [
            ("virtualmachineinstances.kubevirt.io", vec!["vmi", "vmis"]),
            ("virtualmachines.kubevirt.io", vec!["vm", "vms"]),
            (
                "virtualmachineinstancemigrations.kubevirt.io",
                vec!["vmim", "vmims"],
            ),
            (
                "virtualmachineinstancereplicasets.kubevirt.io",
                vec!["vmirs", "vmirss"],
            ),
            ("kubevirts.kubevirt.io", vec!["kv", "kvs"]),
            (
                "virtualmachinepools.pool.kubevirt.io",
                vec!["vmpool", "vmpools"],
            ),
        ];
        for (name, short) in cases {
            let crd = crd(name);
            assert_eq!(
                crd.spec.names.short_names,
                Some(short.iter().map(|s| (*s).to_owned()).collect())
            );
            assert_eq!(
                crd.spec.names.categories,
                Some(vec!["all".to_owned()]),
                "{name}"
            );
            assert_eq!(crd.spec.scope, "Namespaced");
        }
    }

    #[test]
    fn storage_versions_are_v1_and_v1beta1_with_older_versions_served() {
        let vm = crd("virtualmachines.kubevirt.io");
        let versions: Vec<_> = vm
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage, v.deprecated))
            .collect();
        assert_eq!(
            versions,
            [
                ("v1", true, true, None),
                ("v1alpha3", true, false, Some(true))
            ]
        );
        assert_eq!(
            vm.spec.versions[1].deprecation_warning.as_deref(),
            Some(V1ALPHA3_DEPRECATION_WARNING)
        );
        let pool = crd("virtualmachinepools.pool.kubevirt.io");
        let versions: Vec<_> = pool
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.storage))
            .collect();
        assert_eq!(versions, [("v1beta1", true), ("v1alpha1", false)]);
    }

    #[test]
    fn subresources_match_upstream() {
        let vmi = crd("virtualmachineinstances.kubevirt.io");
        assert!(vmi.spec.versions.iter().all(|v| v.subresources.is_none()));
        for name in [
            "virtualmachines.kubevirt.io",
            "virtualmachineinstancemigrations.kubevirt.io",
            "kubevirts.kubevirt.io",
        ] {
            let sub = crd(name).spec.versions[0].subresources.clone().unwrap();
            assert!(sub.status.is_some() && sub.scale.is_none(), "{name}");
        }
        for name in [
            "virtualmachineinstancereplicasets.kubevirt.io",
            "virtualmachinepools.pool.kubevirt.io",
        ] {
            let sub = crd(name).spec.versions[0].subresources.clone().unwrap();
            let scale = sub.scale.unwrap();
            assert!(sub.status.is_some());
            assert_eq!(scale.spec_replicas_path, ".spec.replicas");
            assert_eq!(scale.status_replicas_path, ".status.replicas");
            assert_eq!(
                scale.label_selector_path.as_deref(),
                Some(".status.labelSelector")
            );
        }
    }

    #[test]
    fn printer_columns_match_upstream() {
        let columns = |name: &str| -> Vec<(String, String, String, Option<i32>)> {
            crd(name).spec.versions[0]
                .additional_printer_columns
                .clone()
                .unwrap()
                .into_iter()
                .map(|c| (c.name, c.type_, c.json_path, c.priority))
                .collect()
        };
        let vm = columns("virtualmachines.kubevirt.io");
        assert_eq!(
            vm,
            [
                (
                    "Age".into(),
                    "date".into(),
                    ".metadata.creationTimestamp".into(),
                    None
                ),
                (
                    "Status".into(),
                    "string".into(),
                    ".status.printableStatus".into(),
                    None
                ),
                (
                    "Ready".into(),
                    "string".into(),
                    ".status.conditions[?(@.type=='Ready')].status".into(),
                    None
                ),
            ]
        );
        let vmi = columns("virtualmachineinstances.kubevirt.io");
        let names: Vec<_> = vmi.iter().map(|c| (c.0.as_str(), c.3)).collect();
        assert_eq!(
            names,
            [
                ("Age", None),
                ("Phase", None),
                ("IP", None),
                ("NodeName", None),
                ("Ready", None),
                ("Live-Migratable", Some(1)),
                ("Paused", Some(1)),
            ]
        );
        assert_eq!(vmi[2].2, ".status.interfaces[0].ipAddress");
        let pool: Vec<_> = columns("virtualmachinepools.pool.kubevirt.io")
            .into_iter()
            .map(|c| c.2)
            .collect();
        assert_eq!(
            pool,
            [
                ".spec.replicas",
                ".status.replicas",
                ".status.readyReplicas",
                ".metadata.creationTimestamp"
            ]
        );
        let vmim: Vec<_> = columns("virtualmachineinstancemigrations.kubevirt.io")
            .into_iter()
            .map(|c| c.2)
            .collect();
        assert_eq!(vmim, [".status.phase", ".spec.vmiName"]);
    }

    #[test]
    fn quantities_are_int_or_string_and_template_metadata_is_preserved() {
        let vm = schema("virtualmachines.kubevirt.io");
        let guest = at(
            &vm,
            &["spec", "template", "spec", "domain", "memory", "guest"],
        );
        assert_eq!(guest["x-kubernetes-int-or-string"], json!(true));
        assert_eq!(
            guest["anyOf"],
            json!([{"type": "integer"}, {"type": "string"}])
        );
        let requests = at(
            &vm,
            &[
                "spec",
                "template",
                "spec",
                "domain",
                "resources",
                "requests",
            ],
        );
        assert_eq!(
            requests["additionalProperties"]["x-kubernetes-int-or-string"],
            json!(true)
        );
        let metadata = at(&vm, &["spec", "template", "metadata"]);
        assert_eq!(metadata["type"], json!("object"));
        assert_eq!(
            metadata["x-kubernetes-preserve-unknown-fields"],
            json!(true)
        );
        let dv = at(&vm, &["spec", "dataVolumeTemplates", "[]", "spec"]);
        assert_eq!(dv["x-kubernetes-preserve-unknown-fields"], json!(true));
        let pool = schema("virtualmachinepools.pool.kubevirt.io");
        let max = at(&pool, &["spec", "maxUnavailable"]);
        assert_eq!(max["x-kubernetes-int-or-string"], json!(true));
    }

    #[test]
    fn odd_json_names_appear_in_the_schema() {
        let vmi = schema("virtualmachineinstances.kubevirt.io");
        for path in [
            &["status", "VSOCKCID"][..],
            &["status", "runtimeUser"],
            &["status", "migrationState", "migrationUid"],
            &["status", "guestOSInfo"],
            &["spec", "domain", "devices", "networkInterfaceMultiqueue"],
            &["spec", "domain", "devices", "autoattachVSOCK"],
            &["spec", "domain", "clock", "timer", "hpet", "present"],
            &[
                "spec",
                "domain",
                "features",
                "hyperv",
                "spinlocks",
                "spinlocks",
            ],
            &["spec", "volumes", "[]", "containerDisk", "image"],
            &["spec", "volumes", "[]", "downwardAPI"],
            &["spec", "networks", "[]", "pod", "vmNetworkCIDR"],
            &[
                "spec",
                "domain",
                "devices",
                "interfaces",
                "[]",
                "masquerade",
            ],
        ] {
            at(&vmi, path);
        }
        let required = at(&vmi, &["spec"])["required"].clone();
        assert_eq!(required, json!(["domain"]));
        let vm = schema("virtualmachines.kubevirt.io");
        assert_eq!(
            at(&vm, &["status", "printableStatus"])["default"],
            json!("Stopped")
        );
        let kv = schema("kubevirts.kubevirt.io");
        let flags = at(&kv, &["spec", "customizeComponents", "flags", "api"]);
        assert_eq!(flags["additionalProperties"]["type"], json!("string"));
    }
}
