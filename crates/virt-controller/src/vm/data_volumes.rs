//! The VM's DataVolumes (upstream `handleDataVolumes` and the DataVolume parts of
//! `updateStatus`, reference §2.1–§2.2, §2.6): pure decisions over the cached DataVolumes.
//!
//! - [`plan`]: for every `dataVolumeTemplates[]` entry whose DataVolume is not in the cache, a
//!   DataVolume to create (the template's metadata and spec, label `kubevirt.io/created-by`,
//!   annotation `cdi.kubevirt.io/allowClaimAdoption`, controller reference to the VM, the
//!   template's priority class when the spec has none); the DataVolumes are *ready* when each
//!   one is `Succeeded`, `WaitForFirstConsumer` or `PendingPopulation`; a `Failed` one gets
//!   upstream's `FailedDataVolumeImport` event.
//! - [`adoption`]: an orphan DataVolume of a template's name is adopted (merge patch of its
//!   owner references, guarded by its UID), as upstream's ref manager does.
//! - [`data_volume_error`] and [`provisioning`]: upstream's `DataVolumeError` and
//!   `Provisioning` predicates over the template's `dataVolume` volumes.
//!
//! The spec is forwarded as the template's JSON, so CDI fields this crate does not type (e.g.
//! `contentType`, `preallocation`) reach CDI unchanged.

use std::sync::Arc;

use kubevirt_api::cdi::{
    ALLOW_CLAIM_ADOPTION_ANNOTATION, API_VERSION, DataVolume, DataVolumePhase as DvPhase,
};
use kubevirt_api::constants::CREATED_BY_LABEL;
use kubevirt_api::v1::VirtualMachine;
use serde_json::{Value, json};

/// Event reason of a created DataVolume.
pub const SUCCESSFUL_DATA_VOLUME_CREATE: &str = "SuccessfulDataVolumeCreate";
/// Event reason of a DataVolume that could not be created.
pub const FAILED_DATA_VOLUME_CREATE: &str = "FailedDataVolumeCreate";
/// Event reason of a failed import.
pub const FAILED_DATA_VOLUME_IMPORT: &str = "FailedDataVolumeImport";
/// VM annotation that, when `"false"`, defers creating DataVolumes until the VM starts.
pub const IMMEDIATE_DATA_VOLUME_CREATION: &str = "kubevirt.io/immediate-data-volume-creation";

/// What [`plan`] decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataVolumePlan {
    /// DataVolumes to create (JSON objects, in template order).
    pub create: Vec<Value>,
    /// Names of DataVolumes that failed (one `FailedDataVolumeImport` event each).
    pub failed: Vec<String>,
    /// Every template's DataVolume exists and is ready for the VMI to be created.
    pub ready: bool,
}

/// The cached DataVolume `name` of the VM's namespace among `cached`.
fn find<'a>(cached: &'a [Arc<DataVolume>], name: &str) -> Option<&'a DataVolume> {
    cached
        .iter()
        .map(AsRef::as_ref)
        .find(|dv| dv.metadata.name.as_deref() == Some(name))
}

/// The DataVolume upstream creates for `template` of `vm`.
pub fn data_volume_from_template(
    vm: &VirtualMachine,
    template: &kubevirt_api::v1::DataVolumeTemplateSpec,
) -> Value {
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.clone().unwrap_or_default();
    labels.insert(
        CREATED_BY_LABEL.to_owned(),
        vm.metadata.uid.clone().unwrap_or_default(),
    );
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    annotations.insert(
        ALLOW_CLAIM_ADOPTION_ANNOTATION.to_owned(),
        "true".to_owned(),
    );
    let mut spec = template.spec.clone();
    let priority = vm
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.clone())
        .filter(|p| !p.is_empty());
    let spec_priority = spec
        .get("priorityClassName")
        .and_then(Value::as_str)
        .is_some_and(|p| !p.is_empty());
    if let Some(priority) = priority
        && !spec_priority
    {
        spec.insert("priorityClassName".into(), Value::String(priority));
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "DataVolume",
        "metadata": {
            "name": meta.name,
            "namespace": vm.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [super::start::owner_reference(vm)],
        },
        "spec": spec,
    })
}

/// Upstream's `handleDataVolumes` without the API calls (see the module documentation);
/// `cached` holds the cached DataVolumes of the VM's templates.
pub fn plan(vm: &VirtualMachine, cached: &[Arc<DataVolume>]) -> DataVolumePlan {
    let mut plan = DataVolumePlan {
        ready: true,
        ..DataVolumePlan::default()
    };
    for template in &vm.spec.data_volume_templates {
        let name = template
            .metadata
            .as_ref()
            .and_then(|m| m.name.as_deref())
            .unwrap_or_default();
        match find(cached, name) {
            None => {
                plan.ready = false;
                plan.create.push(data_volume_from_template(vm, template));
            }
            Some(dv) => match dv.phase() {
                DvPhase::Succeeded | DvPhase::WaitForFirstConsumer | DvPhase::PendingPopulation => {
                }
                DvPhase::Failed => {
                    plan.ready = false;
                    plan.failed.push(name.to_owned());
                }
                _ => plan.ready = false,
            },
        }
    }
    plan
}

/// Whether DataVolumes are created before the VM starts (the default).
pub fn immediate_creation(vm: &VirtualMachine) -> bool {
    vm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IMMEDIATE_DATA_VOLUME_CREATION))
        .is_none_or(|v| v != "false")
}

/// The merge patch adopting an orphan `dv` of one of the VM's templates, or `None` when the
/// DataVolume is not an orphan to adopt (it has a controller, the VM or it is being deleted,
/// or it is no template's).
pub fn adoption(vm: &VirtualMachine, dv: &DataVolume) -> Option<Value> {
    let orphan = dv
        .metadata
        .owner_references
        .as_ref()
        .is_none_or(|refs| !refs.iter().any(|r| r.controller == Some(true)));
    let templated = vm.spec.data_volume_templates.iter().any(|t| {
        t.metadata.as_ref().and_then(|m| m.name.as_deref()) == dv.metadata.name.as_deref()
    });
    let deleting =
        vm.metadata.deletion_timestamp.is_some() || dv.metadata.deletion_timestamp.is_some();
    (orphan && templated && !deleting).then(|| {
        json!({"metadata": {
            "ownerReferences": [super::start::owner_reference(vm)],
            "uid": dv.metadata.uid,
        }})
    })
}

/// The DataVolume names of the VM template's `dataVolume` volumes.
fn volume_data_volumes(vm: &VirtualMachine) -> impl Iterator<Item = &str> {
    vm.spec
        .template
        .spec
        .as_ref()
        .map(|s| s.volumes.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.volume_source.data_volume.as_ref())
        .map(|d| d.name.as_str())
}

/// Upstream's `DataVolumeError`: a template `dataVolume` volume whose cached DataVolume is
/// `Failed`, or whose `Running` condition is False with reason `Error` or `ImagePullFailed`.
pub fn data_volume_error(vm: &VirtualMachine, cached: &[Arc<DataVolume>]) -> bool {
    volume_data_volumes(vm)
        .filter_map(|name| find(cached, name))
        .any(|dv| {
            dv.phase() == DvPhase::Failed
                || dv.condition("Running").is_some_and(|c| {
                    c.status == "False"
                        && matches!(c.reason.as_deref(), Some("Error" | "ImagePullFailed"))
                })
        })
}

/// Upstream's `Provisioning`: a template `dataVolume` volume whose cached DataVolume is neither
/// `Succeeded` nor `PendingPopulation`, and is bound or not waiting for its first consumer.
pub fn provisioning(vm: &VirtualMachine, cached: &[Arc<DataVolume>]) -> bool {
    volume_data_volumes(vm)
        .filter_map(|name| find(cached, name))
        .any(|dv| {
            let phase = dv.phase();
            let bound = dv.condition("Bound").is_some_and(|c| c.status == "True");
            !matches!(phase, DvPhase::Succeeded | DvPhase::PendingPopulation)
                && (bound || phase != DvPhase::WaitForFirstConsumer)
        })
}

/// The names of every DataVolume the VM refers to: its templates' and its template's
/// `dataVolume` volumes' (the cache keys the controller looks up).
pub fn referenced(vm: &VirtualMachine) -> Vec<String> {
    let mut names: Vec<String> = vm
        .spec
        .data_volume_templates
        .iter()
        .filter_map(|t| t.metadata.as_ref().and_then(|m| m.name.clone()))
        .collect();
    for name in volume_data_volumes(vm) {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(extra: &Value) -> VirtualMachine {
        let mut vm = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm", "namespace": "ns", "uid": "vm-uid"},
            "spec": {
                "runStrategy": "Always",
                "dataVolumeTemplates": [
                    {"metadata": {"name": "root", "labels": {"a": "b"}},
                     "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}},
                              "contentType": "kubevirt"}}
                ],
                "template": {"spec": {
                    "priorityClassName": "high",
                    "domain": {"devices": {}},
                    "volumes": [{"name": "root", "dataVolume": {"name": "root"}}]
                }}
            }
        });
        json_patch::merge(&mut vm, extra);
        serde_json::from_value(vm).unwrap()
    }

    fn dv(name: &str, status: &Value) -> Arc<DataVolume> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": API_VERSION, "kind": "DataVolume",
                "metadata": {"name": name, "namespace": "ns", "uid": "dv-uid"},
                "spec": {}, "status": status
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_missing_data_volume_is_created_from_its_template_owned_by_the_vm() {
        let p = plan(&vm(&json!({})), &[]);
        assert!(!p.ready);
        let created = &p.create[0];
        assert_eq!(created["metadata"]["name"], "root");
        assert_eq!(created["metadata"]["namespace"], "ns");
        assert_eq!(created["metadata"]["labels"]["a"], "b");
        assert_eq!(created["metadata"]["labels"][CREATED_BY_LABEL], "vm-uid");
        assert_eq!(
            created["metadata"]["annotations"][ALLOW_CLAIM_ADOPTION_ANNOTATION],
            "true"
        );
        let owner = &created["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "VirtualMachine");
        assert_eq!(owner["uid"], "vm-uid");
        assert_eq!(owner["controller"], true);
        // Untyped fields and the template's priority class reach CDI.
        assert_eq!(created["spec"]["contentType"], "kubevirt");
        assert_eq!(created["spec"]["priorityClassName"], "high");
    }

    #[test]
    fn data_volumes_are_ready_when_succeeded_or_waiting_for_their_consumer() {
        let v = vm(&json!({}));
        for (phase, ready) in [
            ("Succeeded", true),
            ("WaitForFirstConsumer", true),
            ("PendingPopulation", true),
            ("ImportInProgress", false),
            ("Pending", false),
            ("Failed", false),
        ] {
            let p = plan(&v, &[dv("root", &json!({"phase": phase}))]);
            assert_eq!(p.ready, ready, "{phase}");
            assert!(p.create.is_empty());
            assert_eq!(p.failed.len(), usize::from(phase == "Failed"), "{phase}");
        }
    }

    #[test]
    fn an_orphan_of_a_template_name_is_adopted_and_an_owned_one_is_not() {
        let v = vm(&json!({}));
        let orphan = dv("root", &json!({}));
        let patch = adoption(&v, &orphan).unwrap();
        assert_eq!(patch["metadata"]["uid"], "dv-uid");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "vm-uid");
        let mut owned = (*orphan).clone();
        owned.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                controller: Some(true),
                ..Default::default()
            },
        ]);
        assert_eq!(adoption(&v, &owned), None);
        assert_eq!(adoption(&v, &dv("other", &json!({}))), None);
    }

    #[test]
    fn data_volume_error_and_provisioning_follow_upstream() {
        let v = vm(&json!({}));
        let error = |status: Value| data_volume_error(&v, &[dv("root", &status)]);
        let prov = |status: Value| provisioning(&v, &[dv("root", &status)]);
        assert!(error(json!({"phase": "Failed"})));
        assert!(error(json!({"phase": "ImportInProgress", "conditions": [
            {"type": "Running", "status": "False", "reason": "ImagePullFailed"}]})));
        assert!(!error(json!({"phase": "ImportInProgress"})));
        assert!(prov(json!({"phase": "ImportInProgress"})));
        assert!(prov(json!({"phase": "Pending"})));
        assert!(!prov(json!({"phase": "Succeeded"})));
        assert!(!prov(json!({"phase": "WaitForFirstConsumer"})));
        assert!(prov(
            json!({"phase": "WaitForFirstConsumer", "conditions": [
            {"type": "Bound", "status": "True"}]})
        ));
        // A DataVolume not in the cache says nothing.
        assert!(!provisioning(&v, &[]));
    }

    #[test]
    fn creation_is_deferred_only_by_the_annotation_false() {
        assert!(immediate_creation(&vm(&json!({}))));
        let deferred =
            vm(&json!({"metadata": {"annotations": {IMMEDIATE_DATA_VOLUME_CREATION: "false"}}}));
        assert!(!immediate_creation(&deferred));
        assert_eq!(referenced(&deferred), ["root"]);
    }
}
