//! Every manifest in `examples/` decodes into our types, re-encodes without losing a field,
//! and passes the generated CRD's structural schema with nothing pruned — the same checks the
//! embedded API server applies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubevirt_api::pool::v1beta1::VirtualMachinePool;
use kubevirt_api::v1::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceReplicaSet,
};
use kubevirt_apiserver::schema::Schema;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Empty lists carry no information (Go's `omitempty` drops them too).
fn without_empty_lists(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !matches!(v, Value::Array(a) if a.is_empty()))
                .map(|(k, v)| (k.clone(), without_empty_lists(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_empty_lists).collect()),
        other => other.clone(),
    }
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: &Value,
) -> Result<Value, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| format!("decode: {e}"))?;
    serde_json::to_value(&typed).map_err(|e| format!("encode: {e}"))
}

/// Decodes and re-encodes a KubeVirt object; `None` for kinds that are not ours.
fn round_trip_kubevirt(doc: &Value) -> Option<Result<Value, String>> {
    let kind = doc.get("kind")?.as_str()?;
    Some(match kind {
        "VirtualMachine" => round_trip::<VirtualMachine>(doc),
        "VirtualMachineInstance" => round_trip::<VirtualMachineInstance>(doc),
        "VirtualMachineInstanceMigration" => round_trip::<VirtualMachineInstanceMigration>(doc),
        "VirtualMachineInstanceReplicaSet" => round_trip::<VirtualMachineInstanceReplicaSet>(doc),
        "VirtualMachinePool" => round_trip::<VirtualMachinePool>(doc),
        _ => return None,
    })
}

/// kind → compiled schema of its storage version.
fn schemas() -> BTreeMap<String, Schema> {
    let mut out = BTreeMap::new();
    for crd in kubevirt_api::crd::all_crds().expect("CRDs") {
        let crd = serde_json::to_value(&crd).expect("CRD JSON");
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .expect("kind")
            .to_owned();
        let versions = crd["spec"]["versions"].as_array().expect("versions");
        for version in versions
            .iter()
            .filter(|v| v["storage"] == Value::Bool(true))
        {
            let schema = Schema::compile(&version["schema"]["openAPIV3Schema"])
                .unwrap_or_else(|e| panic!("the {kind} schema is not structural: {e}"));
            out.insert(kind.clone(), schema);
        }
    }
    out
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read example");
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("examples dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_example_round_trips_and_passes_its_crd_schema() {
    let schemas = schemas();
    let mut checked = 0;
    for file in yaml_files(&examples_dir()) {
        for doc in documents(&file) {
            let name = format!("{} ({})", file.display(), doc["metadata"]["name"]);
            let encoded = round_trip_kubevirt(&doc)
                .unwrap_or_else(|| panic!("{name}: not a KubeVirt kind"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                without_empty_lists(&encoded),
                without_empty_lists(&doc),
                "{name} lost or changed fields"
            );

            let kind = doc["kind"].as_str().unwrap_or_default();
            let schema = schemas
                .get(kind)
                .unwrap_or_else(|| panic!("no CRD for {kind}"));
            let mut pruned = doc.clone();
            let unknown = schema.prune(&mut pruned);
            assert!(
                unknown.is_empty(),
                "{name}: fields unknown to the CRD schema: {unknown:?}"
            );
            let causes = schema.validate(&pruned);
            assert!(
                causes.is_empty(),
                "{name}: refused by the CRD schema: {causes:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} example objects found");
}

#[test]
fn every_generated_crd_schema_compiles_as_a_structural_schema() {
    assert_eq!(schemas().len(), 7);
}
