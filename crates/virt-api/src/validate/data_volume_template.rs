//! `spec.dataVolumeTemplates` of a VM, as upstream's storage admitter checks them: each entry
//! named, with exactly one of `pvc`/`storage`, populated by exactly one source (or externally
//! through `dataSource`/`dataSourceRef`), referenced by a `persistentVolumeClaim` or
//! `dataVolume` volume of the template, and in the VM's own namespace.
//!
//! The CDI `DataVolumeSpec` is kept as opaque JSON in our types, so the rules read it as JSON.
//! Paths are upstream's, including its singular `dataVolumeTemplate[i]` and the joined
//! `PVC.Storage` / `source.sourceRef` names.

use kubevirt_api::v1::{DataVolumeTemplateSpec, VirtualMachineSpec};
use serde_json::{Map, Value};

use super::{Cause, FieldPath};

/// `ValidateDataVolumeTemplate`: one entry's first problem, else whether a volume refers to it.
#[must_use]
pub fn validate_data_volume_templates(field: &FieldPath, spec: &VirtualMachineSpec) -> Vec<Cause> {
    let volumes = spec
        .template
        .spec
        .as_ref()
        .map(|s| s.volumes.as_slice())
        .unwrap_or_default();
    let mut causes = Vec::new();
    for (i, template) in spec.data_volume_templates.iter().enumerate() {
        let entry = field.child("dataVolumeTemplate").index(i);
        if let Some(cause) = validate_entry(&entry, template) {
            causes.push(cause);
            continue;
        }
        let name = template_name(template);
        let referenced = volumes.iter().any(|v| {
            let source = &v.volume_source;
            source
                .persistent_volume_claim
                .as_ref()
                .is_some_and(|p| p.claim_name == name)
                || source.data_volume.as_ref().is_some_and(|d| d.name == name)
        });
        if !referenced {
            causes.push(Cause::required(
                format!(
                    "DataVolumeTemplate entry {} must be referenced in the VMI template's 'volumes' list",
                    entry.as_str()
                ),
                entry,
            ));
        }
    }
    causes
}

/// Embedded DataVolumes are created in the VM's namespace; another one is refused.
#[must_use]
pub fn validate_data_volume_template_namespaces(
    field: &FieldPath,
    spec: &VirtualMachineSpec,
    vm_namespace: &str,
) -> Vec<Cause> {
    spec.data_volume_templates
        .iter()
        .enumerate()
        .filter_map(|(i, template)| {
            let namespace = template.metadata.as_ref()?.namespace.as_deref()?;
            (!namespace.is_empty() && namespace != vm_namespace).then(|| {
                Cause::invalid(
                    format!(
                        "Embedded DataVolume namespace {namespace} differs from VM namespace {vm_namespace}"
                    ),
                    field.child("dataVolumeTemplates").index(i),
                )
            })
        })
        .collect()
}

fn template_name(template: &DataVolumeTemplateSpec) -> &str {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.name.as_deref())
        .unwrap_or_default()
}

fn validate_entry(entry: &FieldPath, template: &DataVolumeTemplateSpec) -> Option<Cause> {
    let name_field = entry.child("name");
    if template_name(template).is_empty() {
        return Some(Cause::required(
            format!(
                "'name' field must not be empty for DataVolumeTemplate entry {}.",
                name_field.as_str()
            ),
            name_field,
        ));
    }
    let spec = &template.spec;
    let target = match (object(spec, "pvc"), object(spec, "storage")) {
        (None, None) => {
            return Some(Cause::invalid(
                "Missing Data volume PVC or Storage",
                entry.children(&["PVC", "Storage"]),
            ));
        }
        (Some(_), Some(_)) => {
            return Some(Cause::invalid(
                "Duplicate storage definition, both target storage and target pvc defined",
                entry.children(&["PVC", "Storage"]),
            ));
        }
        (Some(target), None) | (None, Some(target)) => target,
    };
    let externally_populated =
        object(target, "dataSourceRef").is_some() || object(target, "dataSource").is_some();
    let source = object(spec, "source");
    let has_source = source.is_some() || object(spec, "sourceRef").is_some();
    if externally_populated && has_source {
        return Some(Cause::invalid(
            "External population is incompatible with Source and SourceRef",
            entry.child("source"),
        ));
    }
    if !externally_populated && !has_source {
        return Some(Cause::invalid(
            "Data volume should have either Source, SourceRef, or be externally populated",
            entry.children(&["source", "sourceRef"]),
        ));
    }
    let sources = source?.values().filter(|v| !v.is_null()).count();
    match sources {
        0 => Some(Cause::invalid(
            "Missing dataVolume valid source",
            entry.child("source"),
        )),
        1 => None,
        _ => Some(Cause::invalid(
            "Multiple dataVolume sources",
            entry.child("source"),
        )),
    }
}

/// `map[key]` when it is a JSON object (null counts as absent, as a nil pointer in Go).
fn object<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    map.get(key).and_then(Value::as_object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm_spec(templates: &Value, volumes: &Value) -> VirtualMachineSpec {
        serde_json::from_value(json!({
            "runStrategy": "Halted",
            "dataVolumeTemplates": templates,
            "template": {"spec": {"domain": {"devices": {}}, "volumes": volumes}},
        }))
        .expect("a VM spec")
    }

    fn messages(causes: &[Cause]) -> Vec<(String, String)> {
        causes
            .iter()
            .map(|c| (c.field.clone(), c.message.clone()))
            .collect()
    }

    fn dv(name: &str, spec: &Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec})
    }

    const BLANK: &str = r#"{"pvc": {"accessModes": ["ReadWriteOnce"]}, "source": {"blank": {}}}"#;

    fn blank() -> Value {
        serde_json::from_str(BLANK).expect("json")
    }

    #[test]
    fn a_template_referenced_by_a_data_volume_or_pvc_volume_is_accepted() {
        let spec = vm_spec(
            &json!([dv("a", &blank()), dv("b", &blank())]),
            &json!([{"name": "x", "dataVolume": {"name": "a"}}, {"name": "y", "persistentVolumeClaim": {"claimName": "b"}}]),
        );
        assert!(validate_data_volume_templates(&FieldPath::new("spec"), &spec).is_empty());
    }

    #[test]
    fn an_unreferenced_template_must_be_referenced_in_the_volumes_list() {
        let spec = vm_spec(&json!([dv("a", &blank())]), &json!([]));
        assert_eq!(
            messages(&validate_data_volume_templates(&FieldPath::new("spec"), &spec)),
            [(
                "spec.dataVolumeTemplate[0]".to_owned(),
                "DataVolumeTemplate entry spec.dataVolumeTemplate[0] must be referenced in the VMI template's 'volumes' list".to_owned()
            )]
        );
    }

    #[test]
    fn each_malformed_entry_reports_its_first_problem_with_upstreams_message() {
        let cases = [
            (
                json!({"spec": blank()}),
                "spec.dataVolumeTemplate[0].name",
                "'name' field must not be empty for DataVolumeTemplate entry spec.dataVolumeTemplate[0].name.",
            ),
            (
                dv("a", &json!({"source": {"blank": {}}})),
                "spec.dataVolumeTemplate[0].PVC.Storage",
                "Missing Data volume PVC or Storage",
            ),
            (
                dv(
                    "a",
                    &json!({"pvc": {}, "storage": {}, "source": {"blank": {}}}),
                ),
                "spec.dataVolumeTemplate[0].PVC.Storage",
                "Duplicate storage definition, both target storage and target pvc defined",
            ),
            (
                dv(
                    "a",
                    &json!({"storage": {"dataSourceRef": {"kind": "X", "name": "y"}}, "source": {"blank": {}}}),
                ),
                "spec.dataVolumeTemplate[0].source",
                "External population is incompatible with Source and SourceRef",
            ),
            (
                dv("a", &json!({"storage": {}})),
                "spec.dataVolumeTemplate[0].source.sourceRef",
                "Data volume should have either Source, SourceRef, or be externally populated",
            ),
            (
                dv("a", &json!({"storage": {}, "source": {}})),
                "spec.dataVolumeTemplate[0].source",
                "Missing dataVolume valid source",
            ),
            (
                dv(
                    "a",
                    &json!({"storage": {}, "source": {"blank": {}, "http": {"url": "http://127.0.0.1/d"}}}),
                ),
                "spec.dataVolumeTemplate[0].source",
                "Multiple dataVolume sources",
            ),
        ];
        for (template, field, message) in cases {
            let spec = vm_spec(
                &json!([template]),
                &json!([{"name": "x", "dataVolume": {"name": "a"}}]),
            );
            assert_eq!(
                messages(&validate_data_volume_templates(
                    &FieldPath::new("spec"),
                    &spec
                )),
                [(field.to_owned(), message.to_owned())],
                "{template}"
            );
        }
    }

    #[test]
    fn externally_populated_and_source_ref_templates_need_no_source() {
        for spec_json in [
            json!({"storage": {"dataSource": {"kind": "VolumeSnapshot", "name": "s"}}}),
            json!({"storage": {}, "sourceRef": {"kind": "DataSource", "name": "fedora"}}),
        ] {
            let spec = vm_spec(
                &json!([dv("a", &spec_json)]),
                &json!([{"name": "x", "dataVolume": {"name": "a"}}]),
            );
            assert!(
                validate_data_volume_templates(&FieldPath::new("spec"), &spec).is_empty(),
                "{spec_json}"
            );
        }
    }

    #[test]
    fn a_template_in_another_namespace_is_refused() {
        let mut other = dv("a", &blank());
        other["metadata"]["namespace"] = json!("elsewhere");
        let mut same = dv("b", &blank());
        same["metadata"]["namespace"] = json!("default");
        let spec = vm_spec(&json!([other, same]), &json!([]));
        assert_eq!(
            messages(&validate_data_volume_template_namespaces(
                &FieldPath::new("spec"),
                &spec,
                "default"
            )),
            [(
                "spec.dataVolumeTemplates[0]".to_owned(),
                "Embedded DataVolume namespace elsewhere differs from VM namespace default"
                    .to_owned()
            )]
        );
    }
}
