use super::*;

fn node(annotations: &serde_json::Value, labels: &serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "node02", "annotations": annotations, "labels": labels},
    }))
    .expect("node")
}

fn at(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

#[test]
fn a_heartbeat_older_than_the_timeout_or_a_missing_node_is_unresponsive() {
    let timeout = Duration::from_secs(300);
    let now = at("2026-12-03T10:00:00Z");
    let beat = |t: &str| node(&json!({"kubevirt.io/heartbeat": t}), &json!({}));
    assert!(is_unresponsive(Some(&beat("2026-12-03T09:54:59Z")), timeout, now).unwrap());
    assert!(!is_unresponsive(Some(&beat("2026-12-03T09:55:00Z")), timeout, now).unwrap());
    assert!(!is_unresponsive(Some(&beat("2026-12-03T09:59:00Z")), timeout, now).unwrap());
    // A clock ahead of ours is not stale.
    assert!(!is_unresponsive(Some(&beat("2026-12-03T10:30:00Z")), timeout, now).unwrap());
    assert!(is_unresponsive(None, timeout, now).unwrap());
    // No annotation: never unresponsive, as upstream.
    assert!(!is_unresponsive(Some(&node(&json!({}), &json!({}))), timeout, now).unwrap());
    let err = is_unresponsive(Some(&beat("yesterday")), timeout, now).unwrap_err();
    assert_eq!(err.value, "yesterday");
}

#[test]
fn only_the_true_label_counts_as_schedulable() {
    assert!(is_schedulable(Some(&node(
        &json!({}),
        &json!({"kubevirt.io/schedulable": "true"})
    ))));
    assert!(!is_schedulable(Some(&node(
        &json!({}),
        &json!({"kubevirt.io/schedulable": "false"})
    ))));
    assert!(!is_schedulable(Some(&node(&json!({}), &json!({})))));
    assert!(!is_schedulable(None));
}

fn pod(name: &str, vmi_uid: Option<&str>, phase: &str, terminated: &[bool]) -> Pod {
    let owners = vmi_uid.map_or(json!([]), |uid| {
        json!([{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "name": "vm", "uid": uid, "controller": true}])
    });
    let statuses: Vec<_> = terminated
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let state = if *t {
                json!({"terminated": {"exitCode": 137}})
            } else {
                json!({"running": {}})
            };
            json!({"name": format!("c{i}"), "image": "i", "imageID": "", "ready": false,
                   "restartCount": 0, "state": state})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "ownerReferences": owners},
        "status": {"phase": phase, "containerStatuses": statuses},
    }))
    .expect("pod")
}

#[test]
fn alive_pods_are_vmi_controlled_not_final_and_not_all_terminated() {
    let pods = [
        pod("running", Some("u1"), "Running", &[false, false]),
        pod("half", Some("u2"), "Running", &[true, false]),
        pod("all-terminated", Some("u3"), "Running", &[true, true]),
        pod("failed", Some("u4"), "Failed", &[true]),
        pod("succeeded", Some("u5"), "Succeeded", &[]),
        pod("pending", Some("u6"), "Pending", &[]),
        pod("handler", None, "Running", &[false]),
    ];
    let names: Vec<String> = alive_launcher_pods(&pods)
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["running", "half", "pending"]);
}

fn vmi(name: &str, uid: &str, phase: &str) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"domain": {"devices": {}}},
        "status": {"phase": phase, "nodeName": "node02"},
    }))
    .expect("vmi")
}

#[test]
fn vmis_whose_pod_still_lives_are_left_alone() {
    let vmis = [
        vmi("alive", "u1", "Running"),
        vmi("dead", "u2", "Running"),
        vmi("gone", "u3", "Scheduled"),
    ];
    let pods = [
        pod("p1", Some("u1"), "Running", &[false]),
        pod("p2", Some("u2"), "Failed", &[true]),
    ];
    let alive = alive_launcher_pods(&pods);
    let stuck: Vec<String> = vmis_without_pods(&vmis, &alive)
        .iter()
        .map(|v| v.name_any())
        .collect();
    assert_eq!(stuck, ["dead", "gone"]);
    // A pod of a VMI with the same UID in another namespace does not count.
    let mut other = pod("p3", Some("u3"), "Running", &[false]);
    other.metadata.namespace = Some("elsewhere".into());
    let alive = vec![&other];
    assert_eq!(vmis_without_pods(&vmis, &alive).len(), 3);
}

#[test]
fn only_running_and_scheduled_vmis_are_active() {
    assert!(is_active(&vmi("a", "u", "Running")));
    assert!(is_active(&vmi("a", "u", "Scheduled")));
    for phase in ["Pending", "Scheduling", "Succeeded", "Failed"] {
        assert!(!is_active(&vmi("a", "u", phase)), "{phase}");
    }
}

#[test]
fn the_handler_daemonset_is_settled_when_scheduled_or_ready_matches_desired() {
    let ds = |desired: i32, current: i32, ready: i32| -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "virt-handler"},
            "status": {"desiredNumberScheduled": desired, "currentNumberScheduled": current,
                       "numberReady": ready, "numberMisscheduled": 0},
        }))
        .expect("ds")
    };
    assert!(handler_daemonset_settled(&[ds(2, 2, 1)]).unwrap());
    assert!(handler_daemonset_settled(&[ds(2, 1, 2)]).unwrap());
    assert!(!handler_daemonset_settled(&[ds(2, 1, 1)]).unwrap());
    assert!(matches!(
        handler_daemonset_settled(&[]),
        Err(NodeError::HandlerDaemonSets(0))
    ));
    assert!(handler_daemonset_settled(&[ds(1, 1, 1), ds(1, 1, 1)]).is_err());
}

#[test]
fn failing_a_vmi_replaces_the_phase_and_adds_upstreams_reason() {
    assert_eq!(
        failed_vmi_patch(),
        json!([
            {"op": "replace", "path": "/status/phase", "value": "Failed"},
            {"op": "add", "path": "/status/reason", "value": "NodeUnresponsive"},
        ])
    );
    assert_eq!(
        vmi_failed_message("node02"),
        "virt-handler on node node02 is not responsive, marking VMI as failed"
    );
}
