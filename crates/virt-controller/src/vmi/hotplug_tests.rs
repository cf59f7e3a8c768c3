use super::*;
use serde_json::json;

fn vmi(volumes: serde_json::Value, status: serde_json::Value) -> VirtualMachineInstance {
    let mut vmi = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm", "namespace": "default", "uid": "vmi-uid"},
        "spec": {"domain": {"devices": {}}},
    });
    vmi["spec"]["volumes"] = volumes;
    vmi["status"] = status;
    serde_json::from_value(vmi).unwrap()
}

fn boot_and(hot: &[&str]) -> serde_json::Value {
    let mut volumes = vec![
        json!({"name": "root", "containerDisk": {"image": "img"}}),
        json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
    ];
    for name in hot {
        volumes.push(json!({"name": name,
            "persistentVolumeClaim": {"claimName": format!("{name}-claim"), "hotpluggable": true}}));
    }
    json!(volumes)
}

fn launcher() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "virt-launcher-vm-abcde", "namespace": "default", "uid": "launcher-uid"},
        "spec": {"nodeName": "node-a", "containers": [],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))
    .unwrap()
}

fn attachment(name: &str, volumes: &[&str], created: &str, phase: &str, ready: bool) -> Pod {
    let mut pod_volumes = vec![json!({"name": ATTACHMENT_VOLUME, "emptyDir": {}})];
    for v in volumes {
        pod_volumes
            .push(json!({"name": v, "persistentVolumeClaim": {"claimName": format!("{v}-claim")}}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"),
            "creationTimestamp": created,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "virt-launcher-vm-abcde",
                "uid": "launcher-uid", "controller": true}]},
        "spec": {"containers": [], "volumes": pod_volumes},
        "status": {"phase": phase, "containerStatuses": [{"name": ATTACHMENT_CONTAINER, "ready": ready,
            "restartCount": 0, "image": "i", "imageID": ""}]},
    }))
    .unwrap()
}

fn claim(phase: &str) -> PersistentVolumeClaim {
    serde_json::from_value(
        json!({"metadata": {"name": "hot-claim", "namespace": "default"},
        "status": {"phase": phase}}),
    )
    .unwrap()
}

#[test]
fn hotplug_volumes_are_hotpluggable_claims_the_launcher_pod_does_not_mount() {
    let mut volumes = boot_and(&["hot"]);
    // Hotpluggable, but mounted by the launcher pod (it was there at start).
    volumes[1]["persistentVolumeClaim"]["hotpluggable"] = json!(true);
    let vmi = vmi(volumes, json!({}));
    let names: Vec<&str> = hotplug_volumes(&vmi, &launcher())
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["hot"]);
}

#[test]
fn the_first_ready_volume_gets_a_pod_and_a_matching_pod_is_left_alone() {
    let vmi = vmi(boot_and(&["hot"]), json!({}));
    let hot = hotplug_volumes(&vmi, &launcher());
    assert_eq!(plan(&vmi, &hot, &[]).create, ["hot"]);
    assert_eq!(
        plan(&vmi, &[], &[]),
        HotplugPlan::default(),
        "nothing ready, nothing to do"
    );
    let current = attachment(
        "hp-volume-1",
        &["hot"],
        "2026-12-06T10:00:00Z",
        "Running",
        true,
    );
    assert_eq!(plan(&vmi, &hot, &[&current]), HotplugPlan::default());
}

#[test]
fn a_second_volume_replaces_the_pod_keeping_the_old_one_until_the_new_one_runs() {
    let vmi = vmi(
        boot_and(&["hot", "more"]),
        json!({"volumeStatus": [{"name": "hot", "target": "", "phase": "Ready", "hotplugVolume": {}}]}),
    );
    let hot = hotplug_volumes(&vmi, &launcher());
    let old = attachment(
        "hp-volume-1",
        &["hot"],
        "2026-12-06T10:00:00Z",
        "Running",
        true,
    );
    // No pod has both: create one; the running old one is the fallback meanwhile.
    let first = plan(&vmi, &hot, &[&old]);
    assert_eq!(first.create, ["hot", "more"]);
    assert!(first.delete.is_empty());
    // The new one is still starting: no second creation, the old one kept.
    let new = attachment(
        "hp-volume-2",
        &["hot", "more"],
        "2026-12-06T10:01:00Z",
        "Pending",
        false,
    );
    let starting = plan(&vmi, &hot, &[&old, &new]);
    assert_eq!(starting, HotplugPlan::default());
    // Once the new pod runs, the old one goes.
    let new = attachment(
        "hp-volume-2",
        &["hot", "more"],
        "2026-12-06T10:01:00Z",
        "Running",
        true,
    );
    let running = plan(&vmi, &hot, &[&old, &new]);
    assert!(running.create.is_empty());
    assert_eq!(running.delete, ["hp-volume-1"]);
}

#[test]
fn a_removed_volume_keeps_its_pod_while_the_handler_still_uses_it() {
    let in_use = vmi(
        boot_and(&[]),
        json!({"volumeStatus": [{"name": "hot", "target": "", "phase": "Ready", "hotplugVolume": {}}]}),
    );
    let pod = attachment(
        "hp-volume-1",
        &["hot"],
        "2026-12-06T10:00:00Z",
        "Running",
        true,
    );
    assert_eq!(plan(&in_use, &[], &[&pod]), HotplugPlan::default());
    let detaching = vmi(
        boot_and(&[]),
        json!({"volumeStatus": [{"name": "hot", "target": "", "phase": "Detaching", "hotplugVolume": {}}]}),
    );
    assert_eq!(plan(&detaching, &[], &[&pod]).delete, ["hp-volume-1"]);
}

#[test]
fn the_attachment_pod_mounts_each_claim_below_its_socket_on_the_launchers_node() {
    let vmi = vmi(boot_and(&["hot"]), json!({}));
    let pod = render_attachment_pod(&vmi, &launcher(), &["hot".to_owned()], "img:tag");
    let value = serde_json::to_value(&pod).unwrap();
    assert_eq!(value["metadata"]["generateName"], "hp-volume-");
    assert_eq!(value["metadata"]["labels"]["kubevirt.io"], "hotplug-disk");
    assert_eq!(
        value["metadata"]["annotations"]["kubevirt.io/owner-vmi-name"],
        "vm"
    );
    assert_eq!(
        value["metadata"]["annotations"]["kubevirt.io/owner-vmi-uid"],
        "vmi-uid"
    );
    let owner = &value["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("Pod"), Some("launcher-uid"))
    );
    assert_eq!(owner["controller"], true);
    let term = &value["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(term["values"], json!(["node-a"]));
    let container = &value["spec"]["containers"][0];
    assert_eq!(container["args"], json!(["--socket", "/path/hp.sock"]));
    assert_eq!(
        container["volumeMounts"],
        json!([{"name": "hotplug-disks", "mountPath": "/path"}, {"name": "hot", "mountPath": "/path/hot"}])
    );
    assert_eq!(
        value["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"],
        "hot-claim"
    );
}

#[test]
fn the_volume_status_walks_from_the_claim_to_the_attachment_pod_and_out_again() {
    let vmi_now = vmi(boot_and(&["hot"]), json!({}));
    let launcher = launcher();
    let mut statuses = Vec::new();
    let pending = claim("Pending");
    update_volume_status(&vmi_now, &mut statuses, &launcher, &[], &[], |_| None);
    let hot = statuses.iter().find(|s| s.name == "hot").unwrap();
    assert_eq!(hot.phase, Some(VolumePhase::Pending));
    assert_eq!(hot.message.as_deref(), Some("PVC hot-claim not found"));
    update_volume_status(&vmi_now, &mut statuses, &launcher, &[], &[], |_| {
        Some(&pending)
    });
    let hot = statuses.iter().find(|s| s.name == "hot").unwrap();
    assert_eq!(hot.message.as_deref(), Some("PVC is in phase ClaimPending"));

    // A pod with the volume, its container not ready yet: attached, no UID.
    let starting = attachment(
        "hp-volume-1",
        &["hot"],
        "2026-12-06T10:00:00Z",
        "Pending",
        false,
    );
    update_volume_status(
        &vmi_now,
        &mut statuses,
        &launcher,
        &[&starting],
        &[],
        |_| None,
    );
    let hot = statuses.iter().find(|s| s.name == "hot").unwrap();
    assert_eq!(hot.phase, Some(VolumePhase::AttachedToNode));
    assert_eq!(
        hot.message.as_deref(),
        Some("Created hotplug attachment pod hp-volume-1, for volume hot")
    );
    let hp = hot.hotplug_volume.as_ref().unwrap();
    assert_eq!(hp.attach_pod_name.as_deref(), Some("hp-volume-1"));
    assert_eq!(hp.attach_pod_uid, None);
    let ready = attachment(
        "hp-volume-1",
        &["hot"],
        "2026-12-06T10:00:00Z",
        "Running",
        true,
    );
    update_volume_status(&vmi_now, &mut statuses, &launcher, &[&ready], &[], |_| None);
    let hot = statuses.iter().find(|s| s.name == "hot").unwrap();
    assert_eq!(
        hot.hotplug_volume
            .as_ref()
            .unwrap()
            .attach_pod_uid
            .as_deref(),
        Some("hp-volume-1-uid")
    );
    // The handler's phases are kept.
    statuses.iter_mut().find(|s| s.name == "hot").unwrap().phase = Some(VolumePhase::Ready);
    update_volume_status(&vmi_now, &mut statuses, &launcher, &[&ready], &[], |_| None);
    assert_eq!(
        statuses.iter().find(|s| s.name == "hot").unwrap().phase,
        Some(VolumePhase::Ready)
    );
    let names: Vec<&str> = statuses.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["data", "hot", "root"], "sorted by name");

    // Removed from the spec: Detaching while a pod has it, gone after.
    let removed = vmi(boot_and(&[]), json!({}));
    update_volume_status(&removed, &mut statuses, &launcher, &[&ready], &[], |_| None);
    let hot = statuses.iter().find(|s| s.name == "hot").unwrap();
    assert_eq!(hot.phase, Some(VolumePhase::Detaching));
    update_volume_status(&removed, &mut statuses, &launcher, &[], &[], |_| None);
    assert!(statuses.iter().all(|s| s.name != "hot"));
}

#[test]
fn a_vmi_without_hotplug_volumes_keeps_its_volume_status_as_it_is() {
    let vmi_now = vmi(boot_and(&[]), json!({}));
    let mut statuses: Vec<VolumeStatus> = serde_json::from_value(json!([
        {"name": "root", "target": "vda"}, {"name": "data", "target": "vdb"}
    ]))
    .unwrap();
    let before = statuses.clone();
    update_volume_status(&vmi_now, &mut statuses, &launcher(), &[], &[], |_| None);
    assert_eq!(statuses, before, "not even re-sorted");
}

#[test]
fn only_existing_bound_or_waiting_claims_are_ready() {
    assert!(!claim_ready(None));
    assert!(claim_ready(Some(&claim("Bound"))));
    assert!(claim_ready(Some(&claim("Pending"))));
    assert!(!claim_ready(Some(&claim("Lost"))));
}

#[test]
fn events_are_recorded_once_per_transition() {
    let launcher = launcher();
    let vmi_now = vmi(boot_and(&["hot"]), json!({}));
    let pod = attachment(
        "hp-volume-1",
        &["hot"],
        "2026-12-06T10:00:00Z",
        "Running",
        true,
    );
    let mut statuses = Vec::new();
    update_volume_status(&vmi_now, &mut statuses, &launcher, &[], &[], |_| None);
    let before = statuses.clone();
    update_volume_status(&vmi_now, &mut statuses, &launcher, &[&pod], &[], |_| None);
    assert_eq!(
        status_events(&before, &statuses),
        [(
            "SuccessfulCreate",
            "Created hotplug attachment pod hp-volume-1, for volume hot".to_owned()
        )]
    );
    assert!(status_events(&statuses, &statuses).is_empty(), "no repeat");
    let mut deleting = pod.clone();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    let removed = vmi(boot_and(&[]), json!({}));
    let before = statuses.clone();
    update_volume_status(
        &removed,
        &mut statuses,
        &launcher,
        &[&deleting],
        &[],
        |_| None,
    );
    assert_eq!(
        status_events(&before, &statuses),
        [(
            "SuccessfulDelete",
            "Deleted hotplug attachment pod hp-volume-1, for volume hot".to_owned()
        )]
    );
}
