//! CustomResourceDefinitions: validation, status (`Established`, `NamesAccepted`), and
//! turning a stored CRD into served resources in the [`Registry`].
//!
//! Data flow: a CRD write (create/update through the API, or an initial object) stores the
//! CRD with its status already set, then calls [`register`]; the server answers for the new
//! resources from the next request on. At start [`load_all`] registers every stored CRD.

use std::sync::Arc;

use serde_json::{Value, json};
use tracing::warn;

use crate::cause::Cause;
use crate::handlers::common::{WriteOptions, decode_record, now_rfc3339};
use crate::metadata::{NameRule, is_dns_label, is_dns_subdomain};
use crate::registry::{CrdVersionInfo, PrinterColumn, Registry, ResourceInfo};
use crate::schema::Schema;
use crate::state::ApiState;
use crate::status::ApiError;

const CRD_PREFIX: &str = "/registry/apiextensions.k8s.io/customresourcedefinitions/";

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// Structural checks of a CRD object; every problem is one cause.
pub fn validate_crd(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &crd["spec"];
    let group = s(spec, "group");
    let names = &spec["names"];
    let plural = s(names, "plural");
    let kind = s(names, "kind");
    let name = s(&crd["metadata"], "name");
    if group.is_empty() || !is_dns_subdomain(group) || !group.contains('.') {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.group",
            format!("Invalid value: {group:?}: should be a domain with at least one dot"),
        ));
    }
    if !is_dns_label(plural) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.names.plural",
            format!("Invalid value: {plural:?}: a lowercase RFC 1123 label is required"),
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value",
        ));
    }
    if name != format!("{plural}.{group}") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    match spec["scope"].as_str() {
        Some("Namespaced" | "Cluster") => {}
        other => causes.push(Cause::new(
            "FieldValueNotSupported",
            "spec.scope",
            format!(
                "Unsupported value: {:?}: supported values: \"Cluster\", \"Namespaced\"",
                other.unwrap_or("")
            ),
        )),
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.versions",
            "Required value: must have exactly one version marked as storage version",
        ));
    }
    let storage = versions.iter().filter(|v| v["storage"] == true).count();
    if !versions.is_empty() && storage != 1 {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.versions",
            format!(
                "Invalid value: {storage}: must have exactly one version marked as storage version"
            ),
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if let Some(schema) = v["schema"].get("openAPIV3Schema")
            && let Err(e) = Schema::compile(schema)
        {
            causes.push(Cause::new(
                "FieldValueInvalid",
                format!(
                    "spec.versions[{i}].schema.openAPIV3Schema{}",
                    if e.path.is_empty() {
                        String::new()
                    } else {
                        format!(".{}", e.path)
                    }
                ),
                format!("Invalid value: {}", e.message),
            ));
        }
    }
    causes
}

/// Sets the CRD's status as an apiextensions controller would once names are accepted.
pub fn prepare_status(crd: &mut Value) {
    let spec = crd["spec"].clone();
    let mut names = spec["names"].clone();
    if names["singular"].as_str().unwrap_or("").is_empty() {
        names["singular"] = json!(s(&names, "kind").to_ascii_lowercase());
    }
    if names["listKind"].as_str().unwrap_or("").is_empty() {
        names["listKind"] = json!(format!("{}List", s(&names, "kind")));
    }
    let storage: Vec<Value> = spec["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"] == true)
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    let old = crd["status"].clone();
    let mut stored = old["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for v in storage {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    let now = now_rfc3339();
    let cond = |t: &str, reason: &str, msg: &str| {
        let since = old["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
            .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned))
            .unwrap_or_else(|| now.clone());
        json!({"type": t, "status": "True", "lastTransitionTime": since, "reason": reason, "message": msg})
    };
    crd["status"] = json!({
        "conditions": [
            cond("NamesAccepted", "NoConflicts", "no conflicts found"),
            cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": names,
        "storedVersions": stored,
    });
}

fn printer_columns(v: &Value) -> Vec<PrinterColumn> {
    v["additionalPrinterColumns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| PrinterColumn {
                    name: s(c, "name").to_owned(),
                    type_: s(c, "type").to_owned(),
                    format: s(c, "format").to_owned(),
                    description: s(c, "description").to_owned(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                    json_path: s(c, "jsonPath").to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The resources a CRD serves, one per served version (storage version first).
pub fn resources_of(crd: &Value) -> Vec<Arc<ResourceInfo>> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = s(names, "kind");
    let singular = match s(names, "singular") {
        "" => kind.to_ascii_lowercase(),
        x => x.to_owned(),
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut versions: Vec<&Value> = spec["versions"]
        .as_array()
        .map(|vs| vs.iter().filter(|v| v["served"] != false).collect())
        .unwrap_or_default();
    versions.sort_by_key(|v| v["storage"] != true);
    versions
        .into_iter()
        .map(|v| {
            let raw_schema = v["schema"]["openAPIV3Schema"].clone();
            let schema = if raw_schema.is_null() {
                None
            } else {
                match Schema::compile(&raw_schema) {
                    Ok(s) => Some(Arc::new(s)),
                    Err(e) => {
                        warn!(crd = s(&crd["metadata"], "name"), error = %e, "CRD schema does not compile");
                        None
                    }
                }
            };
            let mut subresources = Vec::new();
            if v["subresources"].get("status").is_some() {
                subresources.push("status".to_owned());
            }
            let scale = v["subresources"].get("scale").map(|sc| {
                subresources.push("scale".to_owned());
                (
                    s(sc, "specReplicasPath").to_owned(),
                    s(sc, "statusReplicasPath").to_owned(),
                    s(sc, "labelSelectorPath").to_owned(),
                )
            });
            Arc::new(ResourceInfo {
                group: s(spec, "group").to_owned(),
                version: s(v, "name").to_owned(),
                kind: kind.to_owned(),
                plural: s(names, "plural").to_owned(),
                singular: singular.clone(),
                short_names: strings(&names["shortNames"]),
                namespaced: spec["scope"] != "Cluster",
                categories: strings(&names["categories"]),
                subresources,
                name_rule: NameRule::Subdomain,
                crd: Some(CrdVersionInfo {
                    schema,
                    raw_schema,
                    printer_columns: printer_columns(v),
                    scale,
                }),
                create_only: false,
            })
        })
        .collect()
}

/// Serves (or re-serves) the resources of a stored CRD.
pub fn register(registry: &Registry, crd: &Value) {
    let name = s(&crd["metadata"], "name");
    let group = s(&crd["spec"], "group");
    let plural = s(&crd["spec"]["names"], "plural");
    if registry.is_builtin(group, plural) {
        warn!(
            crd = name,
            "CRD would shadow a built-in resource; not served"
        );
        return;
    }
    registry.set_custom(name, resources_of(crd));
}

/// Registers every CRD in the store (at start).
pub fn load_all(state: &ApiState) {
    for r in state.store.list(CRD_PREFIX, None, None).records {
        match decode_record(&r) {
            Ok(crd) => register(&state.registry, &crd),
            Err(e) => warn!(key = r.key, error = %e, "skipping unreadable CRD"),
        }
    }
}

/// Deletes every custom object of `crd` (CRD deletion).
pub async fn delete_custom_objects(
    state: &ApiState,
    crd: &Value,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    if opts.dry_run {
        return Ok(());
    }
    let Some(info) = resources_of(crd).into_iter().next() else {
        return Ok(());
    };
    for r in state.store.list(&info.key_prefix(), None, None).records {
        match state.store.delete(&r.key, None).await {
            Ok(_) | Err(kubevirt_store::StoreError::NotFound(_)) => {}
            Err(e) => return Err(ApiError::internal(format!("deleting {}: {e}", r.key))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widget_crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": "Color", "type": "string", "jsonPath": ".spec.color"}]}]}
        })
    }

    #[test]
    fn a_valid_crd_has_no_causes_and_gets_established() {
        let mut crd = widget_crd();
        assert!(validate_crd(&crd).is_empty());
        prepare_status(&mut crd);
        assert_eq!(crd["status"]["conditions"][1]["type"], "Established");
        assert_eq!(crd["status"]["acceptedNames"]["listKind"], "WidgetList");
        assert_eq!(crd["status"]["storedVersions"][0], "v1");
    }

    #[test]
    fn crd_name_must_be_plural_dot_group() {
        let mut crd = widget_crd();
        crd["metadata"]["name"] = json!("widgets.other.com");
        let causes = validate_crd(&crd);
        assert_eq!(causes[0].field, "metadata.name");
    }

    #[test]
    fn served_versions_become_resources() {
        let r = resources_of(&widget_crd());
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].plural, "widgets");
        assert!(r[0].namespaced && r[0].has_status());
        assert_eq!(r[0].short_names, vec!["wd"]);
        assert_eq!(
            r[0].crd.as_ref().unwrap().printer_columns[0].json_path,
            ".spec.color"
        );
    }
}
