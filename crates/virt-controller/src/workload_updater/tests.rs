use serde_json::{Value, json};

use super::*;

const NEW: &str = "registry/virt-launcher:v2";
const OLD: &str = "registry/virt-launcher:v1";

fn vmi(name: &str, image: Option<&str>, extra: &Value) -> VirtualMachineInstance {
    let mut v = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"domain": {"devices": {}}},
        "status": {"phase": "Running"},
    });
    if let Some(image) = image {
        v["status"]["launcherContainerImageVersion"] = json!(image);
    }
    json_patch::merge(&mut v, extra);
    serde_json::from_value(v).expect("VMI")
}

fn migratable() -> Value {
    json!({"status": {"conditions": [{"type": "LiveMigratable", "status": "True"}]}})
}

fn migration(
    name: &str,
    vmi: &str,
    phase: &str,
    workload_update: bool,
) -> VirtualMachineInstanceMigration {
    let mut m = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"vmiName": vmi},
        "status": {"phase": phase},
    });
    if workload_update {
        m["metadata"]["annotations"] = json!({"kubevirt.io/workloadUpdateMigration": ""});
    }
    serde_json::from_value(m).expect("migration")
}

fn strategy(methods: &[&str]) -> UpdateStrategy {
    let kv: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"workloadUpdateStrategy": {"workloadUpdateMethods": methods}},
    }))
    .expect("KubeVirt");
    UpdateStrategy::of(&kv)
}

fn names(vmis: &[&VirtualMachineInstance]) -> Vec<String> {
    vmis.iter().map(|v| v.name_any()).collect()
}

#[test]
fn only_a_known_image_other_than_the_controllers_is_outdated() {
    assert!(is_outdated(&vmi("a", Some(OLD), &json!({})), NEW));
    assert!(!is_outdated(&vmi("b", Some(NEW), &json!({})), NEW));
    assert!(
        !is_outdated(&vmi("c", None, &json!({})), NEW),
        "not known yet"
    );
    assert!(!is_outdated(&vmi("d", Some(""), &json!({})), NEW));
    let done = vmi("e", Some(OLD), &json!({"status": {"phase": "Succeeded"}}));
    assert!(!is_outdated(&done, NEW), "final");
}

#[test]
fn the_strategy_takes_upstreams_defaults_and_the_crs_values() {
    let none = strategy(&[]);
    assert!(!none.live_migrate && !none.evict);
    assert_eq!(none.batch_size, DEFAULT_BATCH_EVICTION_SIZE);
    assert_eq!(none.batch_interval, DEFAULT_BATCH_EVICTION_INTERVAL);
    let kv: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt"},
        "spec": {"workloadUpdateStrategy": {"workloadUpdateMethods": ["LiveMigrate", "Evict"],
            "batchEvictionSize": 3, "batchEvictionInterval": "1m30s"}},
    }))
    .expect("KubeVirt");
    assert_eq!(
        UpdateStrategy::of(&kv),
        UpdateStrategy {
            live_migrate: true,
            evict: true,
            batch_size: 3,
            batch_interval: Duration::from_secs(90),
        }
    );
}

#[test]
fn migratable_vmis_migrate_and_the_others_are_evicted_when_both_methods_are_listed() {
    let (a, b, c) = (
        vmi("a", Some(OLD), &migratable()),
        vmi("b", Some(OLD), &json!({})),
        vmi("c", Some(NEW), &migratable()),
    );
    let vmis = [&a, &b, &c];
    let both = plan(&vmis, &[], NEW, &strategy(&["LiveMigrate", "Evict"]));
    assert_eq!(both.outdated, 2);
    assert_eq!(names(&both.migrate), ["a"]);
    assert_eq!(names(&both.evict), ["b"]);
    let evict_only = plan(&vmis, &[], NEW, &strategy(&["Evict"]));
    assert_eq!(
        names(&evict_only.evict),
        ["a", "b"],
        "without LiveMigrate every one is evicted"
    );
    let migrate_only = plan(&vmis, &[], NEW, &strategy(&["LiveMigrate"]));
    assert_eq!(names(&migrate_only.migrate), ["a"]);
    assert!(
        migrate_only.evict.is_empty(),
        "b waits: nothing may evict it"
    );
    let neither = plan(&vmis, &[], NEW, &strategy(&[]));
    assert_eq!(
        neither.outdated, 2,
        "counted even without automatic updates"
    );
    assert!(!neither.has_work());
}

#[test]
fn a_vmi_with_a_migration_under_way_is_counted_but_left_alone() {
    let started = json!({"status": {"conditions": [{"type": "LiveMigratable", "status": "True"}],
        "migrationState": {"startTimestamp": "2026-12-07T08:00:00Z"}}});
    let (a, b) = (
        vmi("a", Some(OLD), &started),
        vmi("b", Some(OLD), &migratable()),
    );
    let pending = migration("m-b", "b", "Pending", false);
    let running = migration("m-x", "x", "Running", false);
    let done = migration("m-old", "a", "Succeeded", true);
    let p = plan(
        &[&a, &b],
        &[&pending, &running, &done],
        NEW,
        &strategy(&["LiveMigrate"]),
    );
    assert_eq!(p.outdated, 2);
    assert!(p.migrate.is_empty(), "{:?}", names(&p.migrate));
    assert_eq!(p.running_migrations, 1, "Pending does not count as running");
}

#[test]
fn an_up_to_date_vmi_loses_its_workload_update_migration_unless_its_target_is_ready() {
    let (a, b) = (
        vmi("a", Some(NEW), &json!({})),
        vmi(
            "b",
            Some(NEW),
            &json!({"status": {
        "migrationState": {"targetNodeDomainReadyTimestamp": "2026-12-07T08:00:00Z"}}}),
        ),
    );
    let update_a = migration("wu-a", "a", "Scheduling", true);
    let update_b = migration("wu-b", "b", "Running", true);
    let user_a = migration("user-a", "a", "Scheduling", false);
    let p = plan(
        &[&a, &b],
        &[&update_a, &update_b, &user_a],
        NEW,
        &strategy(&["LiveMigrate"]),
    );
    assert_eq!(p.abort.len(), 1);
    assert_eq!(p.abort[0].0.name_any(), "a");
    assert_eq!(p.abort[0].1, ["wu-a"], "a user's migration stays");
}

#[test]
fn the_migration_names_the_vmi_with_upstreams_annotation_and_priority() {
    let m = new_migration(&vmi("a", Some(OLD), &json!({})));
    let v = serde_json::to_value(&m).expect("json");
    assert_eq!(v["metadata"]["generateName"], "kubevirt-workload-update-");
    assert_eq!(v["metadata"]["namespace"], "default");
    assert_eq!(
        v["metadata"]["annotations"],
        json!({"kubevirt.io/workloadUpdateMigration": ""})
    );
    assert_eq!(
        v["spec"],
        json!({"vmiName": "a", "priority": "system-critical"})
    );
}

#[test]
fn the_outdated_count_is_written_only_when_it_changes() {
    let kv = |status: Value| -> KubeVirt {
        let mut v = json!({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt"}, "spec": {}});
        if !status.is_null() {
            v["status"] = status;
        }
        serde_json::from_value(v).expect("KubeVirt")
    };
    assert_eq!(
        outdated_count_patch(
            &kv(json!({"outdatedVirtualMachineInstanceWorkloads": 2})),
            2
        ),
        None
    );
    assert_eq!(
        outdated_count_patch(
            &kv(json!({"outdatedVirtualMachineInstanceWorkloads": 2})),
            0
        ),
        Some(json!([
            {"op": "test", "path": "/status/outdatedVirtualMachineInstanceWorkloads", "value": 2},
            {"op": "replace", "path": "/status/outdatedVirtualMachineInstanceWorkloads", "value": 0},
        ]))
    );
    assert_eq!(
        outdated_count_patch(&kv(json!({"phase": "Deployed"})), 1),
        Some(
            json!([{"op": "add", "path": "/status/outdatedVirtualMachineInstanceWorkloads", "value": 1}])
        )
    );
    let created = outdated_count_patch(&kv(Value::Null), 0).expect("a patch");
    assert_eq!(created[0]["path"], "/status");
}
