use k8s_openapi::api::core::v1::Pod;
use kubevirt_api::v1::{MigrationPhase, VirtualMachineInstance, VirtualMachineInstanceMigration};
use serde_json::{Value, json};

use super::phase::{FAILED_MIGRATION, VmiAction, decide};

const UID: &str = "0f9c1e7a-1111-4222-8333-444455556666";

fn migration(phase: &str, extra: &Value) -> VirtualMachineInstanceMigration {
    let mut m = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "m", "namespace": "default", "uid": UID},
        "spec": {"vmiName": "a"},
        "status": {"phase": phase},
    });
    merge(&mut m, extra);
    serde_json::from_value(m).expect("migration")
}

fn vmi(state: &Value) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "a", "namespace": "default", "uid": "vmi"},
        "spec": {"domain": {"devices": {}}},
        "status": {"phase": "Running", "nodeName": "node01", "migrationState": state},
    }))
    .expect("vmi")
}

fn pod(phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "virt-launcher-a-x", "namespace": "default"},
        "spec": {"nodeName": "node02", "containers": []},
        "status": {"phase": phase, "containerStatuses": [
            {"name": "compute", "ready": phase == "Running", "restartCount": 0, "image": "i", "imageID": "",
             "state": if phase == "Running" { json!({"running": {}}) } else { json!({"waiting": {}}) }}]},
    }))
    .expect("pod")
}

fn merge(base: &mut Value, extra: &Value) {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match b.get_mut(k) {
                Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                _ => {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

#[test]
fn a_migration_moves_through_upstreams_phases_as_the_handlers_report() {
    let none = json!(null);
    let ours = |extra: Value| {
        let mut s = json!({"migrationUid": UID, "targetNode": "node02", "sourceNode": "node01"});
        merge(&mut s, &extra);
        s
    };
    let running = pod("Running");
    let cases: Vec<(&str, Value, Option<&Pod>, MigrationPhase)> = vec![
        ("", none.clone(), None, MigrationPhase::Pending),
        (
            "Pending",
            none.clone(),
            Some(&running),
            MigrationPhase::Scheduling,
        ),
        (
            "Scheduling",
            none.clone(),
            Some(&running),
            MigrationPhase::Scheduled,
        ),
        (
            "Scheduled",
            ours(json!({})),
            Some(&running),
            MigrationPhase::PreparingTarget,
        ),
        (
            "PreparingTarget",
            ours(json!({})),
            Some(&running),
            MigrationPhase::PreparingTarget,
        ),
        (
            "PreparingTarget",
            ours(json!({"targetNodeAddress": "10.0.0.2"})),
            Some(&running),
            MigrationPhase::TargetReady,
        ),
        (
            "TargetReady",
            ours(json!({"startTimestamp": "2026-01-01T00:00:00Z"})),
            Some(&running),
            MigrationPhase::Running,
        ),
        (
            "Running",
            ours(json!({"completed": true})),
            Some(&running),
            MigrationPhase::Succeeded,
        ),
    ];
    for (phase, state, target, want) in cases {
        let d = decide(
            &migration(phase, &json!({})),
            Some(&vmi(&state)),
            target,
            false,
        );
        assert_eq!(d.phase, want, "from {phase:?}");
    }
}

#[test]
fn pending_creates_the_target_pod_and_scheduled_hands_off() {
    let d = decide(
        &migration("Pending", &json!({})),
        Some(&vmi(&json!(null))),
        None,
        false,
    );
    assert_eq!(d.action, VmiAction::CreateTargetPod);
    let running = pod("Running");
    let d = decide(
        &migration("Scheduled", &json!({})),
        Some(&vmi(&json!(null))),
        Some(&running),
        false,
    );
    assert_eq!(
        (d.phase, d.action),
        (MigrationPhase::Scheduled, VmiAction::HandOff)
    );
}

#[test]
fn failures_are_detected_with_upstreams_messages() {
    let running = pod("Running");
    let failed_pod = pod("Failed");
    let ours = json!({"migrationUid": UID, "targetNode": "node02"});
    let cases: Vec<(
        VirtualMachineInstanceMigration,
        Option<VirtualMachineInstance>,
        Option<&Pod>,
        &str,
    )> = vec![
        (
            migration("Pending", &json!({})),
            None,
            None,
            "Migration failed because vmi does not exist.",
        ),
        (
            migration("Running", &json!({})),
            Some(vmi(&ours)),
            Some(&failed_pod),
            "Migration failed because target pod shutdown during migration",
        ),
        (
            migration("Scheduled", &json!({})),
            Some(vmi(&json!(null))),
            None,
            "Migration target pod was removed during active migration.",
        ),
        (
            migration("Running", &json!({})),
            Some(vmi(&json!({"migrationUid": "other"}))),
            Some(&running),
            "VMI's migration state was taken over by another migration job during active migration.",
        ),
        (
            migration("Running", &json!({})),
            Some(vmi(&json!({"migrationUid": UID, "failed": true}))),
            Some(&running),
            "source node reported migration failed",
        ),
        (
            migration(
                "Pending",
                &json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
            Some(vmi(&json!(null))),
            None,
            "Migration failed due to being canceled",
        ),
    ];
    for (m, v, target, message) in cases {
        let d = decide(&m, v.as_ref(), target, false);
        assert_eq!(d.phase, MigrationPhase::Failed, "{message}");
        assert_eq!(
            d.event.map(|e| (e.1, e.2)),
            Some((FAILED_MIGRATION, message))
        );
    }
    let d = decide(
        &migration("", &json!({})),
        Some(&vmi(&json!(null))),
        None,
        true,
    );
    assert_eq!(
        d.event.map(|e| e.2),
        Some("VMI is not eligible for migration because another migration job is in progress.")
    );
}

#[test]
fn deleting_a_handed_off_migration_asks_the_handler_to_abort_once() {
    let running = pod("Running");
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    let m = migration("Running", &deleting);
    let v = vmi(&json!({"migrationUid": UID, "targetNode": "node02"}));
    let d = decide(&m, Some(&v), Some(&running), false);
    assert_eq!(d.phase, MigrationPhase::Running);
    assert!(d.abort_condition);
    assert_eq!(d.action, VmiAction::Abort);
    let asked = vmi(&json!({"migrationUid": UID, "targetNode": "node02", "abortRequested": true}));
    let d = decide(&m, Some(&asked), Some(&running), false);
    assert_eq!(d.action, VmiAction::None);
}

#[test]
fn a_pending_target_pod_is_deleted_after_upstreams_timeouts() {
    use super::phase::pending_pod;
    let created = 1_000_000;
    let pending = |unschedulable: bool| -> Pod {
        let conditions = if unschedulable {
            json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": "virt-launcher-a-x", "namespace": "default",
                "creationTimestamp": "1970-01-12T13:46:40Z"},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": conditions},
        }))
        .expect("pod")
    };
    let m = migration("Scheduling", &json!({}));
    let early = pending_pod(&m, &pending(true), created + 10).expect("pending");
    assert!(early.unschedulable && early.delete.is_none());
    assert_eq!(early.recheck_seconds, Some(290));
    let late = pending_pod(&m, &pending(true), created + 300).expect("pending");
    assert_eq!(
        late.delete.as_deref(),
        Some("unschedulable pod default/virt-launcher-a-x timeout period exceeded")
    );
    let scheduled_but_pending = pending_pod(&m, &pending(false), created + 300).expect("pending");
    assert_eq!(scheduled_but_pending.delete, None);
    let stuck = pending_pod(&m, &pending(false), created + 900).expect("pending");
    assert_eq!(
        stuck.delete.as_deref(),
        Some("pending pod default/virt-launcher-a-x timeout period exceeded")
    );
    let short = migration(
        "Scheduling",
        &json!({"metadata": {"annotations": {"kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "5"}}}),
    );
    assert!(
        pending_pod(&short, &pending(true), created + 5)
            .expect("pending")
            .delete
            .is_some()
    );
    assert_eq!(pending_pod(&m, &pod("Running"), created), None);
}
