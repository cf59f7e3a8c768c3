use serde_json::{Value, json};

use super::*;

fn node(taints: &Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": "node01"}, "spec": {"taints": taints}}))
        .expect("node")
}

fn vmi(name: &str, strategy: Option<&str>, status: &Value) -> VirtualMachineInstance {
    let mut v = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"domain": {"devices": {}}},
        "status": {"phase": "Running", "nodeName": "node01",
                   "conditions": [{"type": "LiveMigratable", "status": "True"}]},
    });
    if let Some(s) = strategy {
        v["spec"]["evictionStrategy"] = json!(s);
    }
    for (k, val) in status.as_object().into_iter().flatten() {
        v["status"][k] = val.clone();
    }
    serde_json::from_value(v).expect("vmi")
}

fn names(vmis: &[&VirtualMachineInstance]) -> Vec<String> {
    vmis.iter().map(|v| v.name_any()).collect()
}

#[test]
fn a_drain_tainted_node_evacuates_all_else_only_marked_vmis() {
    let marked = vmi("marked", None, &json!({"evacuationNodeName": "node01"}));
    let moved = vmi("moved", None, &json!({"evacuationNodeName": "node02"}));
    let migrating = vmi(
        "migrating",
        None,
        &json!({"evacuationNodeName": "node01", "migrationState": {"completed": false}}),
    );
    let plain = vmi("plain", None, &json!({}));
    let all = [&marked, &moved, &migrating, &plain];
    let untainted = node(&json!([]));
    assert_eq!(
        names(&vmis_to_migrate(&untainted, &all, DEFAULT_DRAIN_TAINT_KEY)),
        ["marked"]
    );
    let tainted = node(&json!([{"key": "kubevirt.io/drain", "effect": "NoSchedule"}]));
    assert_eq!(
        vmis_to_migrate(&tainted, &all, DEFAULT_DRAIN_TAINT_KEY).len(),
        4
    );
    // Another effect, or another configured key, is not the drain taint.
    let no_execute = node(&json!([{"key": "kubevirt.io/drain", "effect": "NoExecute"}]));
    assert!(!has_drain_taint(&no_execute, DEFAULT_DRAIN_TAINT_KEY));
    assert!(!has_drain_taint(&tainted, "example.com/drain"));
}

#[test]
fn only_migratable_vmis_that_want_to_migrate_and_are_not_migrating_are_candidates() {
    let live = vmi("live", Some("LiveMigrate"), &json!({}));
    let if_possible = vmi("if-possible", Some("LiveMigrateIfPossible"), &json!({}));
    let external = vmi("external", Some("External"), &json!({}));
    let none = vmi("none", Some("None"), &json!({}));
    let unmigratable = vmi(
        "unmigratable",
        Some("LiveMigrate"),
        &json!({"conditions": [{"type": "LiveMigratable", "status": "False"}]}),
    );
    let failed = vmi("failed", Some("LiveMigrate"), &json!({"phase": "Failed"}));
    let busy = vmi("busy", Some("LiveMigrate"), &json!({}));
    let two_pods = vmi(
        "two-pods",
        Some("LiveMigrate"),
        &json!({"activePods": {"a": "node01", "b": "node02"}}),
    );
    let by_cluster = vmi("by-cluster", None, &json!({}));
    let all = [
        &live,
        &if_possible,
        &external,
        &none,
        &unmigratable,
        &failed,
        &busy,
        &two_pods,
        &by_cluster,
    ];
    let unfinished: BTreeSet<String> = ["ns/busy".to_owned()].into();
    assert_eq!(
        names(&migration_candidates(&all, &unfinished, None)),
        ["live", "if-possible"]
    );
    assert_eq!(
        names(&migration_candidates(
            &all,
            &unfinished,
            Some(&EvictionStrategy::LiveMigrate)
        )),
        ["live", "if-possible", "by-cluster"]
    );
}

#[test]
fn evacuation_migrations_carry_upstreams_name_annotation_and_priority() {
    let m = new_migration(&vmi("vm", None, &json!({})), "node01");
    let v = serde_json::to_value(&m).expect("json");
    assert_eq!(v["metadata"]["generateName"], "kubevirt-evacuation-");
    assert_eq!(v["metadata"]["namespace"], "ns");
    assert!(v["metadata"]["name"].is_null());
    assert_eq!(
        v["metadata"]["annotations"]["kubevirt.io/evacuationMigration"],
        "node01"
    );
    assert_eq!(
        v["spec"],
        json!({"vmiName": "vm", "priority": "system-critical"})
    );
    let mut descheduled = vmi("vm", None, &json!({}));
    descheduled.metadata.annotations = Some(
        [(
            EVICTION_SOURCE_ANNOTATION.to_owned(),
            "descheduler".to_owned(),
        )]
        .into(),
    );
    let v = serde_json::to_value(new_migration(&descheduled, "node01")).expect("json");
    assert_eq!(v["spec"]["priority"], "system-maintenance");
}
